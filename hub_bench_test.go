package eventbus

import (
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"
)

// Hub benchmarks: lookup and get-or-create at 10,000 sessions, and publish
// on distinct sessions in parallel. Run with -cpu 1,2: with no global lock
// on the path, the time per operation falls with the second processor.
//
//	go test -run '^$' -bench 'Hub' -benchmem -cpu 1,2 -count 10 .

const benchHubSessions = 10_000

func benchHub(b *testing.B) (*Hub, []string) {
	h, err := NewHub(HubOptions{MaxSessions: benchHubSessions})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = h.Close() })
	ids := make([]string, benchHubSessions)
	for i := range ids {
		ids[i] = "session-" + strconv.Itoa(i)
		if _, err := h.GetOrCreate(ids[i]); err != nil {
			b.Fatal(err)
		}
	}
	return h, ids
}

func BenchmarkHubLookup(b *testing.B) {
	h, ids := benchHub(b)
	var seq atomic.Uint64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(7919)) // each goroutine walks from its own place
		for pb.Next() {
			if _, ok := h.Lookup(ids[i%len(ids)]); !ok {
				b.Error("missing session")
				return
			}
			i++
		}
	})
}

func BenchmarkHubGetOrCreate(b *testing.B) {
	h, ids := benchHub(b)
	var seq atomic.Uint64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(7919))
		for pb.Next() {
			if _, err := h.GetOrCreate(ids[i%len(ids)]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkHubGetOrCreateNew creates and deletes sessions: the path of a
// session's first publish and its end.
func BenchmarkHubGetOrCreateNew(b *testing.B) {
	h, _ := benchHub(b)
	h.maxSessions = 2 * benchHubSessions
	var seq atomic.Uint64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := "new-" + strconv.FormatUint(seq.Add(1), 10)
			if _, err := h.GetOrCreate(id); err != nil {
				b.Error(err)
				return
			}
			h.Delete(id)
		}
	})
}

// BenchmarkHubPublish publishes through Hub.Publish, each goroutine to its
// own session among 10,000, with no subscriber.
func BenchmarkHubPublish(b *testing.B) {
	benchHubPublish(b, func(h *Hub, id string) func(Event) (Frame, error) {
		return func(e Event) (Frame, error) { return h.Publish(id, e) }
	})
}

// BenchmarkHubBusPublish is BenchmarkHubPublish on the buses directly:
// what the hub's hooks (activity, budget) cost a bus's own Publish.
func BenchmarkHubBusPublish(b *testing.B) {
	benchHubPublish(b, func(h *Hub, id string) func(Event) (Frame, error) {
		bus, _ := h.Lookup(id)
		return bus.Publish
	})
}

func benchHubPublish(b *testing.B, publisher func(h *Hub, id string) func(Event) (Frame, error)) {
	h, ids := benchHub(b)
	ev := Event{Type: "t", Data: json.RawMessage(`{"n":1}`)}
	var seq atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		publish := publisher(h, ids[int(seq.Add(1)*7919)%len(ids)])
		for pb.Next() {
			if _, err := publish(ev); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkHubBusPublishAlone is the same publish on buses made by New,
// outside any hub: the baseline for BenchmarkHubBusPublish.
func BenchmarkHubBusPublishAlone(b *testing.B) {
	ev := Event{Type: "t", Data: json.RawMessage(`{"n":1}`)}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		bus, err := New(Options{})
		if err != nil {
			b.Error(err)
			return
		}
		defer bus.Close()
		for pb.Next() {
			if _, err := bus.Publish(ev); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
