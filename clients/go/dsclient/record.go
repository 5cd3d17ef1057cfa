package dsclient

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	commonv1 "dataservice/clients/go/gen/dataservice/common/v1"
	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
)

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is one record as a sidecar delivered it. Ack or Nack it through the Client that
// returned it: the client remembers which sidecar delivered it, under which lease epoch.
type Record struct {
	Topic         string
	Partition     int32
	Offset        int64
	Timestamp     time.Time // zero when the record has none
	Key           []byte    // nil: a Kafka null
	Value         []byte    // nil: a Kafka null
	Headers       []Header
	LeaseEpoch    int64 // the epoch of the lease it was delivered under; acks echo it
	DeliveryCount int32 // 1 the first time, more after a redelivery

	sidecar string // the address of the sidecar that delivered it
	// next is the offset of the record that follows it in its delivered run (its batch),
	// -1 when it is the last: an ack range may span the offsets between (they hold no
	// record: compaction, transaction markers).
	next int64
}

// decodeBatch decodes a RecordBatch (docs/client-protocol.md §6): little-endian int64
// offsets and timestamps, int32 key and value lengths (-1 = null, no bytes), empty key
// lengths = every key null, empty timestamps = none has one; headers by index.
func decodeBatch(b *sidecarv1.RecordBatch, sidecar string) ([]Record, error) {
	offsets := b.GetOffsets()
	if len(offsets)%8 != 0 {
		return nil, fmt.Errorf("dsclient: batch offsets of %d bytes", len(offsets))
	}
	n := len(offsets) / 8
	ts, vl, kl := b.GetTimestamps(), b.GetValueLengths(), b.GetKeyLengths()
	if (len(ts) != 0 && len(ts) != 8*n) || len(vl) != 4*n || (len(kl) != 0 && len(kl) != 4*n) {
		return nil, fmt.Errorf("dsclient: batch columns disagree on %d records", n)
	}
	values, keys := b.GetValues(), b.GetKeys()
	out := make([]Record, n)
	var vpos, kpos int
	for i := range n {
		r := &out[i]
		r.Topic, r.Partition, r.LeaseEpoch = b.GetTopic(), b.GetPartition(), b.GetLeaseEpoch()
		r.DeliveryCount, r.sidecar = b.GetDeliveryCount(), sidecar
		r.Offset = int64(binary.LittleEndian.Uint64(offsets[8*i:]))
		r.next = -1
		if i > 0 {
			out[i-1].next = r.Offset
		}
		if len(ts) != 0 {
			if ms := int64(binary.LittleEndian.Uint64(ts[8*i:])); ms >= 0 {
				r.Timestamp = time.UnixMilli(ms)
			}
		}
		var err error
		if r.Value, vpos, err = take(values, vpos, int32(binary.LittleEndian.Uint32(vl[4*i:]))); err != nil {
			return nil, err
		}
		if len(kl) != 0 {
			if r.Key, kpos, err = take(keys, kpos, int32(binary.LittleEndian.Uint32(kl[4*i:]))); err != nil {
				return nil, err
			}
		}
	}
	for _, h := range b.GetHeaders() {
		idx := int(h.GetIndex())
		if idx < 0 || idx >= n {
			return nil, fmt.Errorf("dsclient: batch header index %d of %d records", idx, n)
		}
		out[idx].Headers = headers(h.GetHeaders())
	}
	return out, nil
}

// take is the next length bytes of data from pos (nil for -1, a Kafka null).
func take(data []byte, pos int, length int32) ([]byte, int, error) {
	if length < 0 {
		return nil, pos, nil
	}
	end := pos + int(length)
	if end > len(data) {
		return nil, pos, fmt.Errorf("dsclient: batch data shorter than its lengths")
	}
	return data[pos:end:end], end, nil
}

func headers(hs []*commonv1.Header) []Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]Header, len(hs))
	for i, h := range hs {
		out[i] = Header{Key: h.GetKey(), Value: h.GetValue()}
	}
	return out
}

// decodeRecords converts Record messages (a sidecar that predates batches).
func decodeRecords(rs []*commonv1.Record, sidecar string) []Record {
	out := make([]Record, len(rs))
	for i, m := range rs {
		r := Record{
			Topic: m.GetTopic(), Partition: m.GetPartition(), Offset: m.GetOffset(),
			Key: m.Key, Value: m.Value, Headers: headers(m.GetHeaders()),
			LeaseEpoch: m.GetLeaseEpoch(), DeliveryCount: m.GetDeliveryCount(),
			sidecar: sidecar, next: -1,
		}
		if m.GetTimestamp() != nil {
			r.Timestamp = m.GetTimestamp().AsTime()
		}
		if i > 0 && out[i-1].Topic == r.Topic && out[i-1].Partition == r.Partition && out[i-1].LeaseEpoch == r.LeaseEpoch {
			out[i-1].next = r.Offset
		}
		out[i] = r
	}
	return out
}

// decodeResponse is every record of a Fetch response or a Stream batch, in order.
func decodeResponse(batches []*sidecarv1.RecordBatch, records []*commonv1.Record, sidecar string) ([]Record, error) {
	out := decodeRecords(records, sidecar)
	for _, b := range batches {
		rs, err := decodeBatch(b, sidecar)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

// span is a run of records to ack or nack as one range: one sidecar, partition and epoch,
// [from, to), holding count records.
type span struct {
	sidecar   string
	topic     string
	partition int32
	epoch     int64
	from, to  int64
	count     int
}

func (s span) rangeAck() *sidecarv1.RangeAck {
	return &sidecarv1.RangeAck{Topic: s.topic, Partition: s.partition, FromOffset: s.from, ToOffset: s.to, LeaseEpoch: s.epoch}
}

// spansOf cuts records into ranges that cover exactly them (§8, C29): a whole delivered
// batch is one range per partition run (gaps in its offsets hold no record), a subset is
// cut wherever a record between two given ones was delivered but not given. Duplicates
// count once.
func spansOf(records []Record) []span {
	rs := slices.Clone(records)
	slices.SortFunc(rs, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.sidecar, b.sidecar), cmp.Compare(a.Topic, b.Topic),
			cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.LeaseEpoch, b.LeaseEpoch),
			cmp.Compare(a.Offset, b.Offset))
	})
	var out []span
	for i, r := range rs {
		if i > 0 {
			p, last := rs[i-1], &out[len(out)-1]
			same := p.sidecar == r.sidecar && p.Topic == r.Topic && p.Partition == r.Partition && p.LeaseEpoch == r.LeaseEpoch
			if same && p.Offset == r.Offset {
				continue // the same record twice
			}
			if same && (r.Offset == p.Offset+1 || r.Offset == p.next) {
				last.to, last.count = r.Offset+1, last.count+1
				continue
			}
		}
		out = append(out, span{sidecar: r.sidecar, topic: r.Topic, partition: r.Partition,
			epoch: r.LeaseEpoch, from: r.Offset, to: r.Offset + 1, count: 1})
	}
	return out
}
