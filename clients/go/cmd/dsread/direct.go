package main

import (
	"context"
	"fmt"
	"io"

	"dataservice/clients/go/dsclient"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// directBatch bounds the records printed and counted together.
const directBatch = 500

// readDirect is the benchmark's baseline: confluent-kafka-go (cgo over its bundled
// librdkafka) subscribes to the topic in the group from the earliest offset, counts the
// records, commits after each batch (up to 500 records, or what came before a
// 100 ms poll found nothing), and closes. Records print with epoch 0 and delivery count 1 (no mesh
// lease, as the Python reader); acked is what the commits covered.
func readDirect(ctx context.Context, a args, t *tally, stderr io.Writer) error {
	consumer, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers":  a.bootstrap,
		"group.id":           a.group,
		"auto.offset.reset":  "earliest",
		"enable.auto.commit": false,
	})
	if err != nil {
		return fmt.Errorf("kafka consumer: %w", err)
	}
	defer consumer.Close()
	if err := consumer.Subscribe(a.topic, nil); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	batch := make([]dsclient.Record, 0, directBatch)
	// flush prints and counts a batch, then commits it (synchronously, as the Python reader).
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		t.received(batch)
		if _, err := consumer.Commit(); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		t.acked(len(batch))
		batch = batch[:0]
		return nil
	}
	for !t.complete() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch e := consumer.Poll(100).(type) {
		case *kafka.Message:
			tp := e.TopicPartition
			batch = append(batch, dsclient.Record{Topic: *tp.Topic, Partition: tp.Partition, Offset: int64(tp.Offset), DeliveryCount: 1})
			if len(batch) < directBatch {
				continue
			}
		case kafka.Error:
			if e.IsFatal() {
				return fmt.Errorf("kafka: %w", e)
			}
			fmt.Fprintln(stderr, "kafka:", e)
		}
		if err := flush(); err != nil {
			return err
		}
	}
	return flush()
}
