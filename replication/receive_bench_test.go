package replication

import (
	"fmt"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store"
	"github.com/edgelimit/edgelimit/region"
	"github.com/edgelimit/edgelimit/replication/core"
)

// BenchmarkReceiveDelta is the receive path of one delta batch of 1000 slots
// of a global limit's keys, as the Replicator's loop runs it: decode, the
// core's Step (with its checks), and the store's Apply (a replicating
// pop/store.Memory). bounds=none checks the sender against the topology
// only; bounds=rules also bounds counts by the rules (pop.ReplicaBounds),
// where every count here is under the floor (4 × the lowest limit) and so
// needs no lookup; bounds=lookup adds a rule of 10 per minute, so the floor
// is 40 and most counts are looked up. Reported per slot.
func BenchmarkReceiveDelta(b *testing.B) {
	const n = 1000
	root := &rules.Node{}
	l := &rules.Limit{Domain: "api", Path: "api_key", Name: "api_key", Unit: rules.Minute, Scope: rules.ScopeGlobal,
		Spec: limit.Spec{Algorithm: limit.SlidingWindow, Limit: 1000, Window: int64(time.Minute)}}
	root.Child("api_key", "").Add(l)
	set, err := rules.NewSet(rules.NewDomain("api", "bench", root))
	if err != nil {
		b.Fatal(err)
	}
	low := *l
	low.Path, low.Name, low.Spec.Limit = "ip", "ip", 10
	root2 := &rules.Node{}
	root2.Child("api_key", "").Add(l)
	root2.Child("ip", "").Add(&low)
	lowSet, err := rules.NewSet(rules.NewDomain("api", "bench", root2))
	if err != nil {
		b.Fatal(err)
	}
	topo := region.Topology{Regions: map[string][]string{"eu": {"fra1", "par1"}}}
	now := time.Now().UnixNano()
	window := now - now%int64(time.Minute)
	slots := make([]crdt.Slot, n)
	for i := range slots {
		key := l.AppendKey(nil, []rules.Entry{{Key: "api_key", Value: fmt.Sprintf("key-%08d", i)}})
		slots[i] = crdt.Slot{Key: string(key), Window: window, Replica: "par1", Count: uint64(i % 900)}
	}
	data := appendDeltaBatch(nil, "par1", "eu", 1, now, slots)
	for _, bc := range []struct {
		name   string
		bounds *rules.Set
	}{{"none", nil}, {"rules", set}, {"lookup", lowSet}} {
		b.Run("bounds="+bc.name, func(b *testing.B) {
			mem := store.NewMemory(store.MemoryConfig{Replica: "fra1", RegionPeers: []string{"par1"}})
			cfg := core.Config{Region: "eu", POP: "fra1", Topology: topo, Counts: mem}
			if bc.bounds != nil {
				cfg.Bounds = pop.NewEngine(mem, bc.bounds, nil).ReplicaBounds()
			}
			c, err := core.New(cfg, now)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				got, sent, err := decodeDelta(data, "eu", "par1")
				if err != nil {
					b.Fatal(err)
				}
				c.Step(now, core.Message{Kind: core.Delta, Region: "eu", POP: "par1", Sent: sent, Slots: got})
				rd := c.Ready()
				for _, a := range rd.Apply {
					mem.ApplyAt(now, a.Sent, a.Slots)
				}
				c.Advance(rd)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/slot")
		})
	}
}
