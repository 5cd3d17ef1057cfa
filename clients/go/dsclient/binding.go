package dsclient

import (
	"slices"
	"time"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
)

// EmptyBindingGrace: right after a leader change, an empty binding is not applied while
// the client has sidecars (the new leader has not heard from them yet, §3).
const EmptyBindingGrace = 10 * time.Second

// TopicPartition names one partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Endpoint is one serving sidecar of the binding.
type Endpoint struct {
	SidecarID  string
	Address    string
	Zone       string
	Partitions []TopicPartition
	// LocalAddress is the same service on a Unix domain socket in the sidecar's pod
	// ("unix:/abs/path"), or "" (the sidecar serves TCP only).
	LocalAddress string
}

// bindingState is what the client holds of its binding: the version and the endpoints
// by address. Pure: the client opens and closes the channels its changes name.
type bindingState struct {
	version       int64
	endpoints     map[string]Endpoint
	leaderChanged time.Time // when the client last re-bound on a new leader
}

// change is what applying a binding did.
type change struct {
	applied bool     // the endpoints were replaced
	added   []string // addresses new in the binding, sorted
	removed []string // addresses no longer in it, sorted
}

// apply takes a binding pushed by the watch (§3): one older than the one held is ignored
// (version 0 is applied, as the Python client does); an empty one within the grace after
// a leader change, while sidecars are held, only records its version.
func (s *bindingState) apply(b *assignerv1.Binding, now time.Time) change {
	if b.GetVersion() < s.version && b.GetVersion() != 0 {
		return change{}
	}
	if len(b.GetEndpoints()) == 0 && len(s.endpoints) > 0 && now.Sub(s.leaderChanged) < EmptyBindingGrace {
		s.version = b.GetVersion()
		return change{}
	}
	return s.replace(b)
}

// rebound takes the binding the new leader answered Bind with, whatever its version
// (versions of two leaders are not comparable, O5).
func (s *bindingState) rebound(b *assignerv1.Binding, now time.Time) change {
	s.leaderChanged = now
	if len(b.GetEndpoints()) == 0 && len(s.endpoints) > 0 {
		s.version = b.GetVersion()
		return change{}
	}
	return s.replace(b)
}

func (s *bindingState) replace(b *assignerv1.Binding) change {
	next := make(map[string]Endpoint, len(b.GetEndpoints()))
	for _, e := range b.GetEndpoints() {
		ep := Endpoint{SidecarID: e.GetSidecarId(), Address: e.GetAddress(), Zone: e.GetZone(), LocalAddress: e.GetLocalAddress()}
		for _, tp := range e.GetPartitions() {
			ep.Partitions = append(ep.Partitions, TopicPartition{Topic: tp.GetTopic(), Partition: tp.GetPartition()})
		}
		next[ep.Address] = ep
	}
	c := change{applied: true}
	for addr := range next {
		if _, ok := s.endpoints[addr]; !ok {
			c.added = append(c.added, addr)
		}
	}
	for addr := range s.endpoints {
		if _, ok := next[addr]; !ok {
			c.removed = append(c.removed, addr)
		}
	}
	slices.Sort(c.added)
	slices.Sort(c.removed)
	s.version, s.endpoints = b.GetVersion(), next
	return c
}

// addresses are the bound sidecars' addresses, sorted.
func (s *bindingState) addresses() []string {
	out := make([]string, 0, len(s.endpoints))
	for a := range s.endpoints {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// rotation is the fetch order (§6): the bound sidecars sorted by address, starting at
// cursor modulo their number.
func rotation(addresses []string, cursor int) []string {
	if len(addresses) == 0 {
		return nil
	}
	k := cursor % len(addresses)
	return append(slices.Clone(addresses[k:]), addresses[:k]...)
}
