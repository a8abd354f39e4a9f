package crdt_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/crdt/crdttest"
)

// Fixed windows, one minute apart, as in the rate_test.go habit of t0…t9.
const (
	w0 = int64(1_700_000_040_000_000_000)
	w1 = w0 + 60e9
	w2 = w1 + 60e9
	w3 = w2 + 60e9
)

func slot(key string, window int64, replica string, n uint64) crdt.Slot {
	return crdt.Slot{Key: key, Window: window, Replica: replica, Count: n}
}

func TestCountersJoin(t *testing.T) {
	tests := []struct {
		name        string
		state, join []crdt.Slot
		wantChanged int
		want        []crdt.Slot // the resulting Slots(), in order
	}{
		{name: "nothing into empty"},
		{
			name:        "one slot into empty",
			join:        []crdt.Slot{slot("a", w0, "fra1", 3)},
			wantChanged: 1,
			want:        []crdt.Slot{slot("a", w0, "fra1", 3)},
		},
		{
			name: "zero count is absent",
			join: []crdt.Slot{slot("a", w0, "fra1", 0)},
		},
		{
			name:  "lower count does not win",
			state: []crdt.Slot{slot("a", w0, "fra1", 5)},
			join:  []crdt.Slot{slot("a", w0, "fra1", 4)},
			want:  []crdt.Slot{slot("a", w0, "fra1", 5)},
		},
		{
			name:  "equal count is no change",
			state: []crdt.Slot{slot("a", w0, "fra1", 5)},
			join:  []crdt.Slot{slot("a", w0, "fra1", 5)},
			want:  []crdt.Slot{slot("a", w0, "fra1", 5)},
		},
		{
			name:        "higher count wins",
			state:       []crdt.Slot{slot("a", w0, "fra1", 5)},
			join:        []crdt.Slot{slot("a", w0, "fra1", 6)},
			wantChanged: 1,
			want:        []crdt.Slot{slot("a", w0, "fra1", 6)},
		},
		{
			name:        "redelivered older delta after newer",
			join:        []crdt.Slot{slot("a", w0, "fra1", 9), slot("a", w0, "fra1", 2), slot("a", w0, "fra1", 9)},
			wantChanged: 1,
			want:        []crdt.Slot{slot("a", w0, "fra1", 9)},
		},
		{
			name:        "growing deltas in one batch each count",
			join:        []crdt.Slot{slot("a", w0, "fra1", 1), slot("a", w0, "fra1", 2), slot("a", w0, "fra1", 3)},
			wantChanged: 3,
			want:        []crdt.Slot{slot("a", w0, "fra1", 3)},
		},
		{
			name:  "replicas, keys and windows sort in Slots",
			state: []crdt.Slot{slot("b", w1, "par1", 1), slot("a", w1, "fra1", 2)},
			join: []crdt.Slot{
				slot("b", w0, "fra1", 7), slot("a", w1, "ams1", 4), slot("a", w1, "zrh1", 3),
			},
			wantChanged: 3,
			want: []crdt.Slot{
				slot("b", w0, "fra1", 7),
				slot("a", w1, "ams1", 4), slot("a", w1, "fra1", 2), slot("a", w1, "zrh1", 3),
				slot("b", w1, "par1", 1),
			},
		},
		{
			name:        "empty key and empty replica are values",
			join:        []crdt.Slot{slot("", w0, "", 1), slot("", w0, "x", 2), slot("x", w0, "", 3)},
			wantChanged: 3,
			want:        []crdt.Slot{slot("", w0, "", 1), slot("", w0, "x", 2), slot("x", w0, "", 3)},
		},
		{
			name:        "extreme windows and counts",
			join:        []crdt.Slot{slot("a", math.MaxInt64, "r", math.MaxUint64), slot("a", math.MinInt64, "r", 1), slot("a", 0, "r", 1)},
			wantChanged: 3,
			want:        []crdt.Slot{slot("a", math.MinInt64, "r", 1), slot("a", 0, "r", 1), slot("a", math.MaxInt64, "r", math.MaxUint64)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := crdttest.FromSlots(tt.state...)
			if got := c.Join(tt.join...); got != tt.wantChanged {
				t.Errorf("Join changed %d, want %d", got, tt.wantChanged)
			}
			if got := c.Slots(); !slices.Equal(got, tt.want) {
				t.Errorf("Slots() = %v\nwant %v", got, tt.want)
			}
			if c.Len() != len(tt.want) {
				t.Errorf("Len() = %d, want %d", c.Len(), len(tt.want))
			}
			if again := c.Join(tt.join...); again != 0 {
				t.Errorf("joining the same slots again changed %d, want 0", again)
			}
		})
	}
}

func TestCountersTotal(t *testing.T) {
	var c crdt.Counters
	c.Join(
		slot("a", w0, "fra1", 10), slot("a", w0, "par1", 20), slot("a", w0, "iad1", 300),
		slot("a", w1, "fra1", 1),
		slot("b", w0, "iad1", 7),
		slot("big", w0, "fra1", math.MaxUint64), slot("big", w0, "par1", 2),
	)
	europe := crdt.OneOf("fra1", "par1", "ams1")
	tests := []struct {
		name   string
		key    string
		window int64
		in     func(string) bool
		want   uint64
	}{
		{"all replicas", "a", w0, nil, 330},
		{"one region", "a", w0, europe, 30},
		{"region without counts", "b", w0, europe, 0},
		{"single replica", "a", w0, crdt.OneOf("iad1"), 300},
		{"empty filter", "a", w0, crdt.OneOf(), 0},
		{"other window", "a", w1, nil, 1},
		{"unknown window", "a", w2, nil, 0},
		{"unknown key", "zzz", w0, nil, 0},
		{"saturates", "big", w0, nil, math.MaxUint64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.Total(tt.key, tt.window, tt.in); got != tt.want {
				t.Errorf("Total(%q, %d) = %d, want %d", tt.key, tt.window, got, tt.want)
			}
		})
	}
	t.Run("zero value", func(t *testing.T) {
		var z crdt.Counters
		if got := z.Total("a", w0, nil); got != 0 {
			t.Errorf("Total on zero Counters = %d", got)
		}
		if got := z.Replica("a", w0, "fra1"); got != 0 {
			t.Errorf("Replica on zero Counters = %d", got)
		}
		if z.Slots() != nil || z.Len() != 0 || z.DropBefore(w3) != 0 {
			t.Errorf("zero Counters not empty")
		}
	})
}

func TestCountersReplica(t *testing.T) {
	c := crdttest.FromSlots(slot("a", w0, "fra1", 10), slot("a", w0, "par1", 20), slot("", w1, "", 5))
	tests := []struct {
		key     string
		window  int64
		replica string
		want    uint64
	}{
		{"a", w0, "fra1", 10},
		{"a", w0, "par1", 20},
		{"a", w0, "ams1", 0},
		{"a", w1, "fra1", 0},
		{"", w1, "", 5},
	}
	for _, tt := range tests {
		if got := c.Replica(tt.key, tt.window, tt.replica); got != tt.want {
			t.Errorf("Replica(%q, %d, %q) = %d, want %d", tt.key, tt.window, tt.replica, got, tt.want)
		}
	}
}

func TestCountersDropBefore(t *testing.T) {
	state := []crdt.Slot{
		slot("a", w0, "fra1", 1), slot("a", w0, "par1", 2), slot("b", w0, "fra1", 3),
		slot("a", w1, "fra1", 4),
		slot("a", w2, "fra1", 5),
	}
	tests := []struct {
		name        string
		drops       []int64 // DropBefore calls in order
		wantDropped int     // by the last call
		want        []crdt.Slot
	}{
		{"before first window", []int64{w0}, 0, state},
		{"first window", []int64{w1}, 3, state[3:]},
		{"two windows", []int64{w2}, 4, state[4:]},
		{"everything", []int64{w3}, 5, nil},
		{"floor never goes down", []int64{w2, w0}, 0, state[4:]},
		{"step by step", []int64{w1, w2}, 1, state[4:]},
		{"min int64", []int64{math.MinInt64}, 0, state},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := crdttest.FromSlots(state...)
			var dropped int
			for _, w := range tt.drops {
				dropped = c.DropBefore(w)
			}
			if dropped != tt.wantDropped {
				t.Errorf("dropped %d, want %d", dropped, tt.wantDropped)
			}
			if got := c.Slots(); !slices.Equal(got, tt.want) {
				t.Errorf("Slots() = %v\nwant %v", got, tt.want)
			}
			if c.Len() != len(tt.want) {
				t.Errorf("Len() = %d, want %d", c.Len(), len(tt.want))
			}
			// A late redelivery of everything must not bring a dropped window back.
			c.Join(state...)
			if got := c.Slots(); !slices.Equal(got, tt.want) {
				t.Errorf("after redelivery Slots() = %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestOneOf(t *testing.T) {
	few := []string{"fra1", "par1", ""}
	many := []string{"fra1", "par1", "", "ams1", "mad1", "lhr1", "waw1", "arn1", "mxp1", "cdg1"} // past the linear scan
	for _, names := range [][]string{few, many} {
		in := crdt.OneOf(names...)
		for r, want := range map[string]bool{"fra1": true, "par1": true, "": true, "iad1": false, "fra": false} {
			if got := in(r); got != want {
				t.Errorf("OneOf(%d names)(%q) = %v, want %v", len(names), r, got, want)
			}
		}
	}
	if crdt.OneOf()("") {
		t.Error("OneOf() accepted a replica")
	}
}

func TestCompareSlots(t *testing.T) {
	ordered := []crdt.Slot{
		slot("z", w0, "z", 9),
		slot("a", w1, "z", 9),
		slot("b", w1, "a", 9),
		slot("b", w1, "b", 1),
		slot("b", w1, "b", 2),
	}
	for i := range ordered {
		for j := range ordered {
			got := crdt.CompareSlots(ordered[i], ordered[j])
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got != want {
				t.Errorf("CompareSlots(%v, %v) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
}

// TestJoinLargeBatch: a batch large enough for Join to visit it in table
// order (duplicates, several windows and replicas, zero counts, windows
// below the floor, lower counts after higher ones), or with too many windows
// for that, leaves the same state and reports the same number of changes as
// joining its slots one at a time.
func TestJoinLargeBatch(t *testing.T) {
	rnd := rand.New(rand.NewPCG(8, 9))
	replicas := []string{"fra1", "par1", "ams1", "iad1", "sfo1", "sin1", "syd1", "gru1", "nrt1"}
	for trial := range 20 {
		var one, batch crdt.Counters
		for _, c := range []*crdt.Counters{&one, &batch} {
			c.DropBefore(w1) // a floor: slots of w0 are ignored
			c.Join(crdt.Slot{Key: "seed", Window: w2, Replica: "fra1", Count: 5})
		}
		windows := []int64{w0, w1, w2, w3}
		if trial%2 == 1 { // more windows than Join sorts by: joined in order
			for w := w3 + 60e9; len(windows) < 12; w += 60e9 {
				windows = append(windows, w)
			}
		}
		slots := make([]crdt.Slot, 1024+rnd.IntN(5000))
		for i := range slots {
			slots[i] = crdt.Slot{
				Key:     "k" + strconv.Itoa(rnd.IntN(300*(trial+1))),
				Window:  windows[rnd.IntN(len(windows))],
				Replica: replicas[rnd.IntN(len(replicas))],
				Count:   uint64(rnd.IntN(20)),
			}
		}
		slots = append(slots, slots[:100]...) // redelivered
		want := 0
		for _, s := range slots {
			want += one.Join(s)
		}
		if got := batch.Join(slots...); got != want {
			t.Fatalf("trial %d: batch join changed %d slots, one at a time %d", trial, got, want)
		}
		if a, b := one.Slots(), batch.Slots(); !slices.Equal(a, b) || one.Len() != batch.Len() {
			t.Fatalf("trial %d: batch join left %d slots, one at a time %d (or different ones)", trial, len(b), len(a))
		}
	}
}

func TestEach(t *testing.T) {
	var c crdt.Counters
	c.Join(crdt.Slot{"k", 60, "a", 3}, crdt.Slot{"k", 60, "b", 5}, crdt.Slot{"k", 60, "c", 7}, crdt.Slot{"k", 0, "a", 9}, crdt.Slot{"j", 60, "a", 1})
	got := map[string]uint64{}
	c.Each("k", 60, nil, func(r string, n uint64) { got[r] += n })
	if len(got) != 3 || got["a"] != 3 || got["b"] != 5 || got["c"] != 7 {
		t.Fatalf("Each(k, 60) = %v", got)
	}
	clear(got)
	c.Each("k", 60, crdt.OneOf("b", "c"), func(r string, n uint64) { got[r] += n })
	if len(got) != 2 || got["b"] != 5 || got["c"] != 7 {
		t.Fatalf("Each(k, 60, b|c) = %v", got)
	}
	c.Each("missing", 60, nil, func(string, uint64) { t.Fatal("called for a missing key") })
}
