package crdt_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
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

// The cache-missing benchmarks below hold missKeys keys in two windows, as a
// PoP of the simulator does, and touch a key drawn at random from the whole
// state on every op, so that each op finds its slot out of cache as real
// traffic does. The keys to touch are laid out in op order in one string
// ahead of the timed loop, so that reading the next key is itself sequential
// and only the structure under test misses.
const (
	missKeys = 500_000
	missOps  = 1 << 20 // key sequence length; a power of two
)

func missKey(i int) string { return "api_key=" + strconv.Itoa(i) }

// missSequence returns missOps keys drawn at random from missKeys, each a
// fresh string, and the windows to touch them in, each w0 or w1.
func missSequence() ([]string, []int64) {
	r := rand.New(rand.NewPCG(3, 4))
	var sb strings.Builder
	ends := make([]int, missOps)
	wins := make([]int64, missOps)
	for i := range ends {
		sb.WriteString(missKey(r.IntN(missKeys)))
		ends[i] = sb.Len()
		wins[i] = w0 + int64(r.IntN(2))*(w1-w0)
	}
	all := sb.String()
	seq := make([]string, missOps)
	start := 0
	for i, end := range ends {
		seq[i], start = all[start:end], end
	}
	return seq, wins
}

// heapAfter returns the heap bytes in use after a GC.
func heapAfter() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMissCounters is Counters under cache misses: missKeys keys × 2
// windows, each counted by one replica (an anycast client stays on one PoP)
// or by all six. "join" joins one slot that grows, for a random key and
// window and one of the replicas that counted it (a remote flush arriving);
// "total" reads a random key's total over all replicas, as a check does.
func BenchmarkMissCounters(b *testing.B) {
	seq, wins := missSequence()
	for _, nrep := range []int{1, len(benchReplicas)} {
		before := heapAfter()
		c := new(crdt.Counters)
		for k := range missKeys {
			key := missKey(k)
			for _, w := range []int64{w0, w1} {
				for _, r := range benchReplicas[:nrep] {
					c.Join(crdt.Slot{Key: key, Window: w, Replica: r, Count: 1})
				}
			}
		}
		perKey := float64(heapAfter()-before) / (2 * missKeys)
		next := uint64(2) // above every count of the state and earlier joins, so that every join grows
		b.Run(fmt.Sprintf("replicas=%d/join", nrep), func(b *testing.B) {
			b.ReportAllocs()
			one := make([]crdt.Slot, 1)
			i := 0
			for b.Loop() {
				j := i & (missOps - 1)
				one[0] = crdt.Slot{Key: seq[j], Window: wins[j], Replica: benchReplicas[i%nrep], Count: next}
				next++
				if c.Join(one...) != 1 {
					b.Fatal("join did not grow")
				}
				i++
			}
			b.ReportMetric(perKey, "heapB/key")
		})
		// A flush from another PoP: 512 slots of random keys in one Join,
		// one window, as a delta is; ns/op is per slot.
		b.Run(fmt.Sprintf("replicas=%d/delta=512", nrep), func(b *testing.B) {
			b.ReportAllocs()
			batch := make([]crdt.Slot, 512)
			i := 0
			for b.Loop() {
				if i%len(batch) == 0 {
					for k := range batch {
						j := (i + k) & (missOps - 1)
						batch[k] = crdt.Slot{Key: seq[j], Window: w1, Replica: benchReplicas[(i/len(batch))%nrep], Count: next}
					}
					next++
					c.Join(batch...)
				}
				i++
			}
		})
		b.Run(fmt.Sprintf("replicas=%d/total", nrep), func(b *testing.B) {
			b.ReportAllocs()
			var sum uint64
			i := 0
			for b.Loop() {
				j := i & (missOps - 1)
				sum += c.Total(seq[j], wins[j], nil)
				i++
			}
			if sum == 0 {
				b.Fatal("no counts")
			}
		})
	}
}

// BenchmarkMissLocal is Local under cache misses: missKeys keys × 2 windows
// of own counts, and each op counts or reads a random one of them, as a check
// of a replicated limit does.
func BenchmarkMissLocal(b *testing.B) {
	seq, wins := missSequence()
	bseq := make([][]byte, len(seq))
	for i, k := range seq {
		bseq[i] = []byte(k)
	}
	before := heapAfter()
	l := crdt.NewLocal("fra1")
	for k := range missKeys {
		l.Add(missKey(k), w0, 1)
		l.Add(missKey(k), w1, 1)
	}
	l.Delta()
	perKey := float64(heapAfter()-before) / (2 * missKeys)
	b.Run("add", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			j := i & (missOps - 1)
			l.Add(seq[j], wins[j], 1)
			i++
		}
		b.ReportMetric(perKey, "heapB/key")
	})
	l.Delta()
	b.Run("addBytes", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			j := i & (missOps - 1)
			l.AddBytes(bseq[j], wins[j], 1)
			i++
		}
	})
	l.Delta()
	b.Run("count", func(b *testing.B) {
		b.ReportAllocs()
		var sum uint64
		i := 0
		for b.Loop() {
			j := i & (missOps - 1)
			sum += l.Count(seq[j], wins[j])
			i++
		}
		if sum == 0 {
			b.Fatal("no counts")
		}
	})
}
