package crdt_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
)

// localOp is one step of a Local script: Add, Restore, Delta or DropBefore.
type localOp struct {
	add     *crdt.Slot  // Add(Key, Window, Count); Replica unused
	restore []crdt.Slot // Restore(restore...)
	drop    *int64      // DropBefore(*drop)
	delta   bool        // Delta()
	want    []crdt.Slot // for delta: the expected result
	ret     uint64      // for add: the expected return
	raised  int         // for restore: the expected return
}

func add(key string, window int64, n, ret uint64) localOp {
	return localOp{add: &crdt.Slot{Key: key, Window: window, Count: n}, ret: ret}
}
func delta(want ...crdt.Slot) localOp            { return localOp{delta: true, want: want} }
func dropBefore(w int64) localOp                 { return localOp{drop: &w} }
func restore(raised int, s ...crdt.Slot) localOp { return localOp{restore: s, raised: raised} }

func TestLocal(t *testing.T) {
	tests := []struct {
		name      string
		ops       []localOp
		wantSlots []crdt.Slot // Slots() at the end
	}{
		{name: "nothing to flush", ops: []localOp{delta()}},
		{
			name: "adds accumulate, delta is absolute",
			ops: []localOp{
				add("a", w0, 1, 1), add("a", w0, 2, 3), delta(slot("a", w0, "me", 3)),
				add("a", w0, 4, 7), delta(slot("a", w0, "me", 7)),
				delta(),
			},
			wantSlots: []crdt.Slot{slot("a", w0, "me", 7)},
		},
		{
			name: "delta holds only what changed, sorted",
			ops: []localOp{
				add("b", w1, 1, 1), add("a", w1, 1, 1), add("z", w0, 1, 1),
				delta(slot("z", w0, "me", 1), slot("a", w1, "me", 1), slot("b", w1, "me", 1)),
				add("b", w1, 5, 6),
				delta(slot("b", w1, "me", 6)),
			},
			wantSlots: []crdt.Slot{slot("z", w0, "me", 1), slot("a", w1, "me", 1), slot("b", w1, "me", 6)},
		},
		{
			name: "adding zero changes nothing",
			ops: []localOp{
				add("a", w0, 0, 0), delta(),
				add("a", w0, 2, 2), delta(slot("a", w0, "me", 2)),
				add("a", w0, 0, 2), delta(),
			},
			wantSlots: []crdt.Slot{slot("a", w0, "me", 2)},
		},
		{
			name: "saturates instead of wrapping",
			ops: []localOp{
				add("a", w0, math.MaxUint64-1, math.MaxUint64-1),
				add("a", w0, 5, math.MaxUint64),
				delta(slot("a", w0, "me", math.MaxUint64)),
			},
			wantSlots: []crdt.Slot{slot("a", w0, "me", math.MaxUint64)},
		},
		{
			name: "restore raises and republishes",
			ops: []localOp{
				restore(2, slot("a", w0, "me", 10), slot("b", w0, "me", 4)),
				delta(slot("a", w0, "me", 10), slot("b", w0, "me", 4)),
				add("a", w0, 1, 11),
				delta(slot("a", w0, "me", 11)),
			},
			wantSlots: []crdt.Slot{slot("a", w0, "me", 11), slot("b", w0, "me", 4)},
		},
		{
			name: "restore never lowers",
			ops: []localOp{
				add("a", w0, 10, 10), delta(slot("a", w0, "me", 10)),
				restore(0, slot("a", w0, "me", 3), slot("a", w0, "me", 10)),
				delta(),
			},
			wantSlots: []crdt.Slot{slot("a", w0, "me", 10)},
		},
		{
			name: "restore ignores other replicas and zero counts",
			ops: []localOp{
				restore(0, slot("a", w0, "other", 10), slot("a", w0, "me", 0)),
				delta(),
			},
		},
		{
			name: "drop removes windows and pending changes",
			ops: []localOp{
				add("a", w0, 1, 1), add("a", w1, 2, 2), add("b", w1, 3, 3),
				dropBefore(w1),
				delta(slot("a", w1, "me", 2), slot("b", w1, "me", 3)),
			},
			wantSlots: []crdt.Slot{slot("a", w1, "me", 2), slot("b", w1, "me", 3)},
		},
		{
			name: "dropped window never restarts from zero",
			ops: []localOp{
				add("a", w0, 5, 5), delta(slot("a", w0, "me", 5)),
				dropBefore(w1),
				add("a", w0, 1, 0),
				restore(0, slot("a", w0, "me", 9)),
				dropBefore(w0), // the floor does not go down
				add("a", w0, 1, 0),
				delta(),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := crdt.NewLocal("me")
			for i, op := range tt.ops {
				switch {
				case op.add != nil:
					if got := l.Add(op.add.Key, op.add.Window, op.add.Count); got != op.ret {
						t.Errorf("op %d: Add(%q, %d, %d) = %d, want %d", i, op.add.Key, op.add.Window, op.add.Count, got, op.ret)
					}
				case op.restore != nil:
					if got := l.Restore(op.restore...); got != op.raised {
						t.Errorf("op %d: Restore raised %d, want %d", i, got, op.raised)
					}
				case op.drop != nil:
					l.DropBefore(*op.drop)
				case op.delta:
					if got := l.Delta(); !slices.Equal(got, op.want) {
						t.Errorf("op %d: Delta() = %v\nwant %v", i, got, op.want)
					}
					if l.Pending() != 0 {
						t.Errorf("op %d: Pending() = %d after Delta", i, l.Pending())
					}
				}
			}
			if got := l.Slots(); !slices.Equal(got, tt.wantSlots) {
				t.Errorf("Slots() = %v\nwant %v", got, tt.wantSlots)
			}
			if l.Len() != len(tt.wantSlots) {
				t.Errorf("Len() = %d, want %d", l.Len(), len(tt.wantSlots))
			}
			for _, s := range tt.wantSlots {
				if got := l.Count(s.Key, s.Window); got != s.Count {
					t.Errorf("Count(%q, %d) = %d, want %d", s.Key, s.Window, got, s.Count)
				}
			}
		})
	}
}

func TestLocalDropBeforeCounts(t *testing.T) {
	l := crdt.NewLocal("me")
	l.Add("a", w0, 1)
	l.Add("b", w0, 1)
	l.Add("a", w1, 1)
	if got := l.DropBefore(w1); got != 2 {
		t.Errorf("DropBefore(w1) = %d, want 2", got)
	}
	if got := l.DropBefore(w1); got != 0 {
		t.Errorf("second DropBefore(w1) = %d, want 0", got)
	}
	if got, want := l.Pending(), 1; got != want {
		t.Errorf("Pending() = %d, want %d", got, want)
	}
}

func TestLocalZeroValue(t *testing.T) {
	var l crdt.Local
	if l.Replica() != "" || l.Delta() != nil || l.Slots() != nil || l.Len() != 0 {
		t.Fatal("zero Local is not empty")
	}
	l.Add("k", w0, 2)
	if got, want := l.Delta(), []crdt.Slot{slot("k", w0, "", 2)}; !slices.Equal(got, want) {
		t.Errorf("Delta() = %v, want %v", got, want)
	}
}

// TestAddBytesIsAdd: AddBytes and Add, fed the same counts (known and new
// keys, zero counts, windows below the floor), leave equal Locals and
// return the same values.
func TestAddBytesIsAdd(t *testing.T) {
	a, b := crdt.NewLocal("p1"), crdt.NewLocal("p1")
	rnd := rand.New(rand.NewPCG(7, 7))
	for i := range 5000 {
		key := fmt.Sprintf("k%d", rnd.IntN(50))
		window := int64(rnd.IntN(6)) * 10
		n := uint64(rnd.IntN(3))
		if i == 2500 {
			a.DropBefore(20)
			b.DropBefore(20)
		}
		if x, y := a.Add(key, window, n), b.AddBytes([]byte(key), window, n); x != y {
			t.Fatalf("step %d: Add(%q, %d, %d) = %d, AddBytes = %d", i, key, window, n, x, y)
		}
		if i%97 == 0 && !slices.Equal(a.Delta(), b.Delta()) {
			t.Fatalf("step %d: deltas differ", i)
		}
	}
	if !slices.Equal(a.Slots(), b.Slots()) {
		t.Fatal("slots differ")
	}
}

func TestAddBytesAllocs(t *testing.T) {
	l := crdt.NewLocal("p1")
	key := []byte("known")
	l.AddBytes(key, 10, 1)
	if n := testing.AllocsPerRun(100, func() { l.AddBytes(key, 10, 1) }); n != 0 {
		t.Fatalf("AddBytes of a known key allocates %v times", n)
	}
}
