package crdt_test

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/crdt/crdttest"
)

// fuzzInput turns fuzz bytes into values. Keys, windows and replicas come
// from small tables that include the awkward values (empty strings, a NUL,
// the extreme int64s), so that random inputs collide and reach the edges.
// Reading past the end yields zeros.
type fuzzInput struct{ b []byte }

var (
	fuzzKeys     = []string{"", "a", "b", "a\x00", "ключ"}
	fuzzWindows  = []int64{0, 1, -1, w0, w1, math.MinInt64, math.MaxInt64}
	fuzzReplicas = []string{"", "fra1", "par1", "iad1"}
)

func (in *fuzzInput) more() bool { return len(in.b) > 0 }

func (in *fuzzInput) byte() byte {
	if len(in.b) == 0 {
		return 0
	}
	c := in.b[0]
	in.b = in.b[1:]
	return c
}

func (in *fuzzInput) u64() uint64 {
	var buf [8]byte
	n := copy(buf[:], in.b)
	in.b = in.b[n:]
	return binary.LittleEndian.Uint64(buf[:])
}

func (in *fuzzInput) key() string     { return fuzzKeys[int(in.byte())%len(fuzzKeys)] }
func (in *fuzzInput) window() int64   { return fuzzWindows[int(in.byte())%len(fuzzWindows)] }
func (in *fuzzInput) replica() string { return fuzzReplicas[int(in.byte())%len(fuzzReplicas)] }

// count is small (zero included) or near math.MaxUint64 most of the time, and
// arbitrary otherwise.
func (in *fuzzInput) count() uint64 {
	c := in.byte()
	switch c >> 6 {
	case 0:
		return uint64(c & 63)
	case 1:
		return math.MaxUint64 - uint64(c&63)
	default:
		return in.u64()
	}
}

func (in *fuzzInput) slot() crdt.Slot {
	return crdt.Slot{Key: in.key(), Window: in.window(), Replica: in.replica(), Count: in.count()}
}

func (in *fuzzInput) bit() crdt.Bit {
	return crdt.Bit{Key: in.key(), Scope: in.byte() % 3, Until: in.window(), Origin: in.replica()}
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// FuzzJoin decodes three lists of slots and three lists of bits, a window
// horizon and an instant, and checks that Counters and Bits are
// join-semilattices equal to a naive model: join is commutative, associative
// and idempotent, Join's change count, Total, Replica, Len, Slots order,
// DropBefore (and its floor) and Bits' Active and Expire all agree with the
// model. Nothing may panic on any input.
func FuzzJoin(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 3, 1, 5, 4, 1, 3, 2, 7, 8, 1, 3, 1, 9})
	f.Add([]byte{0, 0, 5, 0, 0x7f, 4, 0, 5, 1, 0x7f, 1, 1, 1, 1, 1, 2, 3, 3})
	f.Add([]byte{0, 2, 6, 3, 0x80, 1, 2, 3, 4, 5, 6, 7, 8, 2, 4, 3, 5, 9, 1, 1, 0, 2, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := fuzzInput{data}
		var (
			lists   [3][]crdt.Slot
			bits    [3][]crdt.Bit
			horizon *int64
			now     int64
		)
		for n := 0; in.more() && n < 200; n++ {
			op := in.byte()
			i := int(op>>2) % 3
			switch op % 4 {
			case 0:
				lists[i] = append(lists[i], in.slot())
			case 1:
				bits[i] = append(bits[i], in.bit())
			case 2:
				h := in.window()
				horizon = &h
			case 3:
				now = in.window()
			}
		}
		checkCounters(t, lists, horizon)
		checkBits(t, bits, now)
	})
}

func checkCounters(t *testing.T, lists [3][]crdt.Slot, horizon *int64) {
	all := slices.Concat(lists[0], lists[1], lists[2])
	var want []crdt.Slot
	for _, s := range naiveJoin(all) {
		if s.Count > 0 {
			want = append(want, s)
		}
	}
	states := make([]*crdt.Counters, 3)
	for i, l := range lists {
		// Join's change count is the number of slots that beat what was held
		// before them, one at a time.
		var c crdt.Counters
		held := map[crdt.Slot]uint64{}
		wantChanged := 0
		for _, s := range l {
			k := s
			k.Count = 0
			if s.Count > held[k] {
				held[k] = s.Count
				wantChanged++
			}
		}
		if got := c.Join(l...); got != wantChanged {
			t.Fatalf("list %d: Join changed %d, want %d", i, got, wantChanged)
		}
		states[i] = &c
	}
	a, b, c := states[0], states[1], states[2]

	abc := joinStates(a, b, c)
	if err := crdttest.DiffSlots(abc.Slots(), want); err != nil {
		t.Fatalf("join differs from the naive maximum: %v", err)
	}
	if abc.Len() != len(want) {
		t.Fatalf("Len() = %d, want %d", abc.Len(), len(want))
	}
	for name, other := range map[string]*crdt.Counters{
		"c⊔b⊔a":       joinStates(c, b, a),
		"(a⊔b)⊔c":     joinStates(joinStates(a, b), c),
		"a⊔(b⊔c)":     joinStates(a, joinStates(b, c)),
		"reversed":    crdttest.FromSlots(reversed(all)...),
		"a⊔b⊔c⊔abc":   joinStates(a, b, c, abc),
		"slot by one": crdttest.FromSlots(all...),
	} {
		if err := crdttest.Converged(abc, other); err != nil {
			t.Fatalf("a⊔b⊔c and %s differ: %v", name, err)
		}
	}
	if n := abc.Join(all...); n != 0 {
		t.Fatalf("joining every slot again changed %d", n)
	}
	if n := abc.Join(abc.Slots()...); n != 0 {
		t.Fatalf("joining the state into itself changed %d", n)
	}

	type cell struct {
		key    string
		window int64
	}
	sums := map[cell]uint64{}
	for _, s := range want {
		sums[cell{s.Key, s.Window}] = satAdd(sums[cell{s.Key, s.Window}], s.Count)
		if got := abc.Replica(s.Key, s.Window, s.Replica); got != s.Count {
			t.Fatalf("Replica(%q, %d, %q) = %d, want %d", s.Key, s.Window, s.Replica, got, s.Count)
		}
		if got := abc.Total(s.Key, s.Window, crdt.OneOf(s.Replica)); got != s.Count {
			t.Fatalf("Total(%q, %d, OneOf(%q)) = %d, want %d", s.Key, s.Window, s.Replica, got, s.Count)
		}
	}
	for k, sum := range sums {
		if got := abc.Total(k.key, k.window, nil); got != sum {
			t.Fatalf("Total(%q, %d) = %d, want %d", k.key, k.window, got, sum)
		}
	}

	if horizon == nil {
		return
	}
	var kept []crdt.Slot
	for _, s := range want {
		if s.Window >= *horizon {
			kept = append(kept, s)
		}
	}
	if got, wantDropped := abc.DropBefore(*horizon), len(want)-len(kept); got != wantDropped {
		t.Fatalf("DropBefore(%d) dropped %d, want %d", *horizon, got, wantDropped)
	}
	if err := crdttest.DiffSlots(abc.Slots(), kept); err != nil {
		t.Fatalf("after DropBefore(%d): %v", *horizon, err)
	}
	if n := abc.Join(all...); n != 0 {
		t.Fatalf("after DropBefore(%d), joining every slot again changed %d", *horizon, n)
	}
	if abc.Len() != len(kept) {
		t.Fatalf("after DropBefore(%d), Len() = %d, want %d", *horizon, abc.Len(), len(kept))
	}
}

func checkBits(t *testing.T, lists [3][]crdt.Bit, now int64) {
	type reg struct {
		key   string
		scope uint8
	}
	model := map[reg]crdt.Bit{}
	beats := func(x, y crdt.Bit) bool { return x.Until > y.Until || x.Until == y.Until && x.Origin > y.Origin }
	var states [3]*crdt.Bits
	for i, l := range lists {
		var s crdt.Bits
		held := map[reg]crdt.Bit{}
		wantChanged := 0
		for _, b := range l {
			k := reg{b.Key, b.Scope}
			if cur, ok := held[k]; !ok || beats(b, cur) {
				held[k] = b
				wantChanged++
			}
			if cur, ok := model[k]; !ok || beats(b, cur) {
				model[k] = b
			}
		}
		if got := s.Join(l...); got != wantChanged {
			t.Fatalf("bits list %d: Join changed %d, want %d", i, got, wantChanged)
		}
		states[i] = &s
	}
	join := func(xs ...*crdt.Bits) *crdt.Bits {
		var s crdt.Bits
		for _, x := range xs {
			s.Join(x.All()...)
		}
		return &s
	}
	a, b, c := states[0], states[1], states[2]
	abc := join(a, b, c)

	var want []crdt.Bit
	for _, bit := range model {
		want = append(want, bit)
	}
	slices.SortFunc(want, crdt.CompareBits)
	if got := abc.All(); !slices.Equal(got, want) {
		t.Fatalf("bits join = %v\nwant %v", got, want)
	}
	for name, other := range map[string]*crdt.Bits{
		"c⊔b⊔a":     join(c, b, a),
		"(a⊔b)⊔c":   join(join(a, b), c),
		"a⊔(b⊔c)":   join(a, join(b, c)),
		"a⊔b⊔c⊔abc": join(a, b, c, abc),
	} {
		if err := crdttest.BitsConverged(abc, other); err != nil {
			t.Fatalf("bits a⊔b⊔c and %s differ: %v", name, err)
		}
	}
	if n := abc.Join(abc.All()...); n != 0 {
		t.Fatalf("joining the bits into themselves changed %d", n)
	}
	for _, w := range want {
		if got, ok := abc.Get(w.Key, w.Scope); !ok || got != w {
			t.Fatalf("Get(%q, %d) = %v, %v; want %v", w.Key, w.Scope, got, ok, w)
		}
	}

	var active []crdt.Bit
	for _, w := range want {
		if now < w.Until {
			active = append(active, w)
		}
	}
	if got := abc.Active(now); !slices.Equal(got, active) {
		t.Fatalf("Active(%d) = %v\nwant %v", now, got, active)
	}
	if got := abc.Expire(now); got != len(want)-len(active) {
		t.Fatalf("Expire(%d) = %d, want %d", now, got, len(want)-len(active))
	}
	if got := abc.All(); !slices.Equal(got, active) {
		t.Fatalf("after Expire(%d) All() = %v\nwant %v", now, got, active)
	}
}

// FuzzLocal decodes a script of Adds, Deltas, Restores, window drops and
// restarts, and checks Local against a model: counts saturate instead of
// wrapping, Delta is strictly ordered and never publishes a value lower than
// one published before (across restarts too), and Count and Len agree with
// the model.
func FuzzLocal(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 3, 5, 1, 0, 1, 3, 0x7f, 1, 2, 1, 3, 1, 9, 1, 4, 3, 2})
	f.Add([]byte{0, 0, 5, 0x4f, 0, 0, 5, 0xff, 1, 3, 0, 0, 0, 5, 2, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		type cell struct {
			key    string
			window int64
		}
		in := fuzzInput{data}
		const me = "fra1"
		l := crdt.NewLocal(me)
		model := map[cell]uint64{}
		published := map[cell]uint64{}
		var persisted []crdt.Slot
		var floor int64
		floored := false
		below := func(w int64) bool { return floored && w < floor }

		for n := 0; in.more() && n < 300; n++ {
			switch in.byte() % 5 {
			case 0:
				c, k := cell{in.key(), in.window()}, in.count()
				got := l.Add(c.key, c.window, k)
				if !below(c.window) && k > 0 {
					model[c] = satAdd(model[c], k)
				}
				if got != model[c] {
					t.Fatalf("Add(%q, %d, %d) = %d, model %d", c.key, c.window, k, got, model[c])
				}
			case 1:
				d := l.Delta()
				persisted = l.Slots()
				for i, s := range d {
					if i > 0 && crdt.CompareSlots(d[i-1], s) >= 0 {
						t.Fatalf("Delta not strictly ordered: %v", d)
					}
					c := cell{s.Key, s.Window}
					if s.Replica != me || s.Count == 0 || s.Count != model[c] {
						t.Fatalf("Delta published %v, model %d", s, model[c])
					}
					if s.Count < published[c] {
						t.Fatalf("published %v after %d", s, published[c])
					}
					published[c] = s.Count
				}
			case 2:
				s := in.slot()
				if in.byte()%2 == 0 {
					s.Replica = me
				}
				l.Restore(s)
				if c := (cell{s.Key, s.Window}); s.Replica == me && !below(s.Window) && s.Count > model[c] {
					model[c] = s.Count
				}
			case 3:
				w := in.window()
				l.DropBefore(w)
				if !floored || w > floor {
					floor, floored = w, true
				}
				for c := range model {
					if below(c.window) {
						delete(model, c)
					}
				}
			case 4:
				l = crdt.NewLocal(me)
				l.Restore(persisted...)
				if floored {
					l.DropBefore(floor)
				}
				clear(model)
				for _, s := range persisted {
					if !below(s.Window) {
						model[cell{s.Key, s.Window}] = s.Count
					}
				}
			}
			if l.Len() != len(model) {
				t.Fatalf("Len() = %d, model holds %d", l.Len(), len(model))
			}
		}
		for c, n := range model {
			if got := l.Count(c.key, c.window); got != n {
				t.Fatalf("Count(%q, %d) = %d, model %d", c.key, c.window, got, n)
			}
		}
	})
}

func reversed(s []crdt.Slot) []crdt.Slot {
	s = slices.Clone(s)
	slices.Reverse(s)
	return s
}
