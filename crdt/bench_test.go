package crdt_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
)

var benchReplicas = []string{"fra1", "par1", "ams1", "iad1", "sfo1", "sin1"}

// benchState returns a Counters with about n slots: every key counted by all
// six replicas in two windows, as in a busy global limit. It also returns the
// slots, and the heap bytes the state takes per slot (report it after the
// loop: b.Loop resets reported metrics).
func benchState(b *testing.B, n int) (*crdt.Counters, []crdt.Slot, float64) {
	b.Helper()
	keys := n / (2 * len(benchReplicas))
	slots := make([]crdt.Slot, 0, keys*2*len(benchReplicas))
	for k := range keys {
		key := "api_key=" + strconv.Itoa(k)
		for _, w := range []int64{w0, w1} {
			for i, r := range benchReplicas {
				slots = append(slots, crdt.Slot{Key: key, Window: w, Replica: r, Count: uint64(k + i + 1)})
			}
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := new(crdt.Counters)
	c.Join(slots...)
	runtime.GC()
	runtime.ReadMemStats(&after)
	return c, slots, float64(after.HeapAlloc-before.HeapAlloc) / float64(c.Len())
}

// BenchmarkJoin joins a 1000-slot delta into states of 1k and 1M slots:
// "grow" raises every slot of the delta (a fresh flush from other PoPs),
// "redeliver" joins the same slots again (a duplicate, changes nothing).
func BenchmarkJoin(b *testing.B) {
	for _, size := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprintf("state=%d", size), func(b *testing.B) {
			c, slots, perSlot := benchState(b, size)
			r := rand.New(rand.NewPCG(1, 2))
			delta := make([]crdt.Slot, 1000)
			for i := range delta {
				delta[i] = slots[r.IntN(len(slots))]
			}
			b.Run("grow/delta=1000", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					for i := range delta {
						delta[i].Count += 1000 // above anything in the state or earlier deltas
					}
					c.Join(delta...)
				}
				b.ReportMetric(perSlot, "heapB/slot")
			})
			b.Run("redeliver/delta=1000", func(b *testing.B) {
				b.ReportAllocs()
				c.Join(delta...)
				for b.Loop() {
					if c.Join(delta...) != 0 {
						b.Fatal("redelivery changed the state")
					}
				}
			})
		})
	}
}

func BenchmarkTotal(b *testing.B) {
	c, _, _ := benchState(b, 120_000) // 10k keys × 2 windows × 6 replicas
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "api_key=" + strconv.Itoa(i*7)
	}
	europe := crdt.OneOf("fra1", "par1", "ams1")
	for _, bc := range []struct {
		name string
		in   func(string) bool
	}{{"replicas=6/all", nil}, {"replicas=6/region", europe}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var sum uint64
			i := 0
			for b.Loop() {
				sum += c.Total(keys[i&1023], w1, bc.in)
				i++
			}
			if sum == 0 {
				b.Fatal("no counts")
			}
		})
	}
}

func BenchmarkLocal(b *testing.B) {
	b.Run("Add/hot", func(b *testing.B) {
		b.ReportAllocs()
		l := crdt.NewLocal("fra1")
		for b.Loop() {
			l.Add("api_key=abc", w0, 1)
		}
	})
	b.Run("Add/keys=10000", func(b *testing.B) {
		b.ReportAllocs()
		l := crdt.NewLocal("fra1")
		keys := make([]string, 10_000)
		for i := range keys {
			keys[i] = "api_key=" + strconv.Itoa(i)
			l.Add(keys[i], w0, 1)
		}
		i := 0
		for b.Loop() {
			l.Add(keys[i%len(keys)], w0, 1)
			i++
		}
	})
	// One flush interval: 1000 Adds spread over `keys` keys, then Delta.
	for _, nkeys := range []int{10, 1000} {
		b.Run(fmt.Sprintf("AddDelta/adds=1000/keys=%d", nkeys), func(b *testing.B) {
			b.ReportAllocs()
			l := crdt.NewLocal("fra1")
			keys := make([]string, nkeys)
			for i := range keys {
				keys[i] = "api_key=" + strconv.Itoa(i)
			}
			for b.Loop() {
				for i := range 1000 {
					l.Add(keys[i%nkeys], w0, 1)
				}
				if len(l.Delta()) != nkeys {
					b.Fatal("short delta")
				}
			}
		})
	}
}

// BenchmarkSlots is the cost of an anti-entropy snapshot of a 1M-slot state.
func BenchmarkSlots(b *testing.B) {
	c, _, _ := benchState(b, 1_000_000)
	b.ReportAllocs()
	for b.Loop() {
		if len(c.Slots()) != c.Len() {
			b.Fatal("short snapshot")
		}
	}
}
