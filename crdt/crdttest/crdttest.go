// Package crdttest holds helpers for testing code built on package crdt: a
// seeded generator of slots and bits over a small space (so that random slots
// collide and joins have work to do), a faulty delivery of batches (drops,
// duplicates, reordering), an exact oracle of what was counted, and
// convergence checks whose errors name the first differing slot.
//
// Randomness is always a *rand.Rand passed in by the caller, so a failing run
// replays from its seed. The package imports the standard library and crdt
// only, and is meant for tests and the simulator, not for production code.
package crdttest

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/edgelimit/edgelimit/crdt"
)

// Space is the finite set of keys, windows and replicas that the random
// generators draw from. Small spaces make slots collide, which is what
// exercises a join. A zero field takes the default given in its comment.
type Space struct {
	Keys     int    // number of keys "k0", "k1", ...; default 4
	Windows  int    // number of windows; default 2
	Replicas int    // number of replicas "r0", "r1", ...; default 3
	Start    int64  // the first window start; default 0
	Length   int64  // the window length, nanoseconds; default one minute
	MaxCount uint64 // counts are drawn from [1, MaxCount]; default 100
}

func (sp Space) withDefaults() Space {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&sp.Keys, 4)
	def(&sp.Windows, 2)
	def(&sp.Replicas, 3)
	if sp.Length <= 0 {
		sp.Length = 60e9
	}
	if sp.MaxCount == 0 {
		sp.MaxCount = 100
	}
	return sp
}

// Key returns the name of the i-th key of the space.
func (sp Space) Key(i int) string { return "k" + strconv.Itoa(i) }

// Replica returns the name of the i-th replica of the space.
func (sp Space) Replica(i int) string { return "r" + strconv.Itoa(i) }

// Window returns the start of the i-th window of the space.
func (sp Space) Window(i int) int64 { return sp.Start + int64(i)*sp.withDefaults().Length }

// RandomSlot draws one slot from the space, with a count in [1, MaxCount].
func (sp Space) RandomSlot(r *rand.Rand) crdt.Slot {
	sp = sp.withDefaults()
	return crdt.Slot{
		Key:     sp.Key(r.IntN(sp.Keys)),
		Window:  sp.Window(r.IntN(sp.Windows)),
		Replica: sp.Replica(r.IntN(sp.Replicas)),
		Count:   1 + r.Uint64N(sp.MaxCount),
	}
}

// RandomSlots returns n slots drawn independently from sp. The same
// (key, window, replica) may occur several times with different counts, as in
// a stream of deltas.
func RandomSlots(r *rand.Rand, n int, sp Space) []crdt.Slot {
	out := make([]crdt.Slot, n)
	for i := range out {
		out[i] = sp.RandomSlot(r)
	}
	return out
}

// RandomBits returns n mitigation bits over the keys and replicas of sp, with
// Scope in [0, 3), Until in the span of the space's windows and Origin one of
// its replicas.
func RandomBits(r *rand.Rand, n int, sp Space) []crdt.Bit {
	sp = sp.withDefaults()
	span := int64(sp.Windows) * sp.Length
	out := make([]crdt.Bit, n)
	for i := range out {
		out[i] = crdt.Bit{
			Key:    sp.Key(r.IntN(sp.Keys)),
			Scope:  uint8(r.IntN(3)),
			Until:  sp.Start + r.Int64N(span),
			Origin: sp.Replica(r.IntN(sp.Replicas)),
		}
	}
	return out
}

// FromSlots returns a new Counters that has joined slots.
func FromSlots(slots ...crdt.Slot) *crdt.Counters {
	var c crdt.Counters
	c.Join(slots...)
	return &c
}

// Clone returns a copy of c, built by joining its slots into a new Counters.
func Clone(c *crdt.Counters) *crdt.Counters { return FromSlots(c.Slots()...) }

// Converged returns nil if a and b hold the same state, and otherwise an
// error naming the first (key, window, replica), in crdt.CompareSlots order,
// whose counts differ, with both counts (an absent slot counts zero).
func Converged(a, b *crdt.Counters) error {
	return DiffSlots(a.Slots(), b.Slots())
}

// DiffSlots compares two slot lists as states: it returns nil if they hold
// the same count for every (key, window, replica), and otherwise an error
// naming the first that differs. Both lists must be in crdt.CompareSlots
// order with at most one slot per (key, window, replica), as Counters.Slots
// and Local.Slots return them; DiffSlots reports a list that is not.
func DiffSlots(a, b []crdt.Slot) error {
	if err := checkOrdered("a", a); err != nil {
		return err
	}
	if err := checkOrdered("b", b); err != nil {
		return err
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		var c int
		switch {
		case i == len(a):
			c = 1
		case j == len(b):
			c = -1
		default:
			c = cmpCell(a[i], b[j])
		}
		switch {
		case c < 0:
			return fmt.Errorf("crdttest: slot key=%q window=%d replica=%q: a has %d, b has none",
				a[i].Key, a[i].Window, a[i].Replica, a[i].Count)
		case c > 0:
			return fmt.Errorf("crdttest: slot key=%q window=%d replica=%q: a has none, b has %d",
				b[j].Key, b[j].Window, b[j].Replica, b[j].Count)
		case a[i].Count != b[j].Count:
			return fmt.Errorf("crdttest: slot key=%q window=%d replica=%q: a has %d, b has %d",
				a[i].Key, a[i].Window, a[i].Replica, a[i].Count, b[j].Count)
		}
		if c <= 0 {
			i++
		}
		if c >= 0 {
			j++
		}
	}
	return nil
}

// cmpCell orders slots like crdt.CompareSlots but ignores Count.
func cmpCell(a, b crdt.Slot) int {
	a.Count, b.Count = 0, 0
	return crdt.CompareSlots(a, b)
}

func checkOrdered(name string, s []crdt.Slot) error {
	for i := 1; i < len(s); i++ {
		if cmpCell(s[i-1], s[i]) >= 0 {
			return fmt.Errorf("crdttest: %s[%d] (%v) does not sort strictly before %s[%d] (%v)",
				name, i-1, s[i-1], name, i, s[i])
		}
	}
	for i, x := range s {
		if x.Count == 0 {
			return fmt.Errorf("crdttest: %s[%d] (%v) has a zero count", name, i, x)
		}
	}
	return nil
}

// BitsConverged returns nil if a and b hold the same bits, and otherwise an
// error naming the first (key, scope), in crdt.CompareBits order, whose bits
// differ.
func BitsConverged(a, b *crdt.Bits) error {
	x, y := a.All(), b.All()
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		var c int
		switch {
		case i == len(x):
			c = 1
		case j == len(y):
			c = -1
		default:
			c = cmp.Or(cmp.Compare(x[i].Key, y[j].Key), cmp.Compare(x[i].Scope, y[j].Scope))
		}
		switch {
		case c < 0:
			return fmt.Errorf("crdttest: bit key=%q scope=%d: a has %v, b has none", x[i].Key, x[i].Scope, x[i])
		case c > 0:
			return fmt.Errorf("crdttest: bit key=%q scope=%d: a has none, b has %v", y[j].Key, y[j].Scope, y[j])
		case x[i] != y[j]:
			return fmt.Errorf("crdttest: bit key=%q scope=%d: a has %v, b has %v", x[i].Key, x[i].Scope, x[i], y[j])
		}
		if c <= 0 {
			i++
		}
		if c >= 0 {
			j++
		}
	}
	return nil
}

// Faults describes what an unreliable transport does to batches.
type Faults struct {
	Drop      float64 // probability that a batch is lost
	Duplicate float64 // probability that a delivered batch is delivered once more (repeatedly)
	Reorder   bool    // deliver the batches in a random order
}

// Deliver returns the batches as an unreliable transport would hand them to
// one receiver: each batch is dropped with probability f.Drop, otherwise
// delivered once and then again as long as a draw falls under f.Duplicate
// (at most 8 copies), and with f.Reorder the deliveries are shuffled. The
// batches themselves are shared, not copied.
func Deliver(r *rand.Rand, batches [][]crdt.Slot, f Faults) [][]crdt.Slot {
	var out [][]crdt.Slot
	for _, b := range batches {
		if r.Float64() < f.Drop {
			continue
		}
		out = append(out, b)
		for n := 1; n < 8 && r.Float64() < f.Duplicate; n++ {
			out = append(out, b)
		}
	}
	if f.Reorder {
		r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	}
	return out
}

// Oracle is the exact record of what every replica counted: the sum of all
// Adds per (key, window). The zero value is empty and ready to use.
type Oracle struct {
	sums map[cellKey]uint64
}

type cellKey struct {
	key    string
	window int64
}

// Add records that some replica counted n for (key, window). It does not
// saturate; keep test counts far from math.MaxUint64.
func (o *Oracle) Add(key string, window int64, n uint64) {
	if n == 0 {
		return
	}
	if o.sums == nil {
		o.sums = make(map[cellKey]uint64)
	}
	o.sums[cellKey{key, window}] += n
}

// Sum returns the exact total counted for (key, window).
func (o *Oracle) Sum(key string, window int64) uint64 { return o.sums[cellKey{key, window}] }

// DropBefore forgets every window before window, as the replicas do.
func (o *Oracle) DropBefore(window int64) {
	maps.DeleteFunc(o.sums, func(k cellKey, _ uint64) bool { return k.window < window })
}

// Check returns nil if c.Total(key, window, nil) equals the exact sum for
// every (key, window) the oracle recorded, and c holds no (key, window) the
// oracle does not know; otherwise an error naming the first (key, window), in
// window-then-key order, that is wrong.
func (o *Oracle) Check(c *crdt.Counters) error {
	keys := slices.SortedFunc(maps.Keys(o.sums), func(a, b cellKey) int {
		return cmp.Or(cmp.Compare(a.window, b.window), cmp.Compare(a.key, b.key))
	})
	for _, k := range keys {
		if got, want := c.Total(k.key, k.window, nil), o.sums[k]; got != want {
			return fmt.Errorf("crdttest: total for key=%q window=%d is %d, counted %d", k.key, k.window, got, want)
		}
	}
	for _, s := range c.Slots() {
		if _, ok := o.sums[cellKey{s.Key, s.Window}]; !ok {
			return fmt.Errorf("crdttest: counters hold %v, but nothing was counted for key=%q window=%d", s, s.Key, s.Window)
		}
	}
	return nil
}
