package crdttest_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/crdt/crdttest"
)

func slot(key string, window int64, replica string, n uint64) crdt.Slot {
	return crdt.Slot{Key: key, Window: window, Replica: replica, Count: n}
}

func TestConverged(t *testing.T) {
	base := []crdt.Slot{slot("a", 0, "r0", 1), slot("a", 0, "r1", 2), slot("b", 60, "r0", 3)}
	tests := []struct {
		name    string
		a, b    []crdt.Slot
		wantErr string // substring; "" means converged
	}{
		{name: "both empty"},
		{name: "equal", a: base, b: base},
		{name: "equal in another join order", a: base, b: []crdt.Slot{base[2], base[0], base[1], base[0]}},
		{
			name:    "count differs",
			a:       base,
			b:       []crdt.Slot{base[0], slot("a", 0, "r1", 5), base[2]},
			wantErr: `slot key="a" window=0 replica="r1": a has 2, b has 5`,
		},
		{
			name:    "b lacks a slot",
			a:       base,
			b:       base[:2],
			wantErr: `slot key="b" window=60 replica="r0": a has 3, b has none`,
		},
		{
			name:    "a lacks a slot",
			a:       base[1:],
			b:       base,
			wantErr: `slot key="a" window=0 replica="r0": a has none, b has 1`,
		},
		{
			name:    "first difference is named",
			a:       []crdt.Slot{slot("a", 0, "r0", 9), slot("z", 0, "r0", 9)},
			b:       []crdt.Slot{slot("a", 0, "r0", 8)},
			wantErr: `slot key="a" window=0 replica="r0": a has 9, b has 8`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := crdttest.Converged(crdttest.FromSlots(tt.a...), crdttest.FromSlots(tt.b...))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Converged = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Converged = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestDiffSlotsRejectsUnorderedInput(t *testing.T) {
	sorted := []crdt.Slot{slot("a", 0, "r0", 1), slot("b", 0, "r0", 1)}
	for name, bad := range map[string][]crdt.Slot{
		"unsorted":  {sorted[1], sorted[0]},
		"duplicate": {sorted[0], sorted[0]},
		"zero":      {slot("a", 0, "r0", 0)},
	} {
		if err := crdttest.DiffSlots(bad, sorted); err == nil {
			t.Errorf("%s: DiffSlots accepted %v", name, bad)
		}
	}
}

func TestBitsConverged(t *testing.T) {
	var a, b crdt.Bits
	a.Join(crdt.Bit{Key: "k", Scope: 1, Until: 10, Origin: "eu"})
	b.Join(crdt.Bit{Key: "k", Scope: 1, Until: 10, Origin: "eu"})
	if err := crdttest.BitsConverged(&a, &b); err != nil {
		t.Errorf("equal bits: %v", err)
	}
	b.Join(crdt.Bit{Key: "k", Scope: 1, Until: 20, Origin: "us"})
	if err := crdttest.BitsConverged(&a, &b); err == nil || !strings.Contains(err.Error(), `bit key="k" scope=1`) {
		t.Errorf("different bits: %v", err)
	}
	b.Join(crdt.Bit{Key: "j", Scope: 0, Until: 20, Origin: "us"})
	if err := crdttest.BitsConverged(&a, &b); err == nil || !strings.Contains(err.Error(), `bit key="j" scope=0: a has none`) {
		t.Errorf("missing bit: %v", err)
	}
}

func TestRandomSlotsStayInSpace(t *testing.T) {
	sp := crdttest.Space{Keys: 2, Windows: 3, Replicas: 2, Start: 600, Length: 60, MaxCount: 5}
	seen := map[crdt.Slot]bool{}
	for _, s := range crdttest.RandomSlots(rand.New(rand.NewPCG(1, 2)), 2000, sp) {
		if s.Count < 1 || s.Count > 5 {
			t.Fatalf("count out of range: %v", s)
		}
		if !slices.Contains([]int64{600, 660, 720}, s.Window) {
			t.Fatalf("window out of range: %v", s)
		}
		s.Count = 0
		seen[s] = true
	}
	if len(seen) != 2*3*2 {
		t.Errorf("drew %d distinct (key, window, replica), want all %d", len(seen), 2*3*2)
	}
	again := crdttest.RandomSlots(rand.New(rand.NewPCG(1, 2)), 10, sp)
	if first := crdttest.RandomSlots(rand.New(rand.NewPCG(1, 2)), 10, sp); !slices.Equal(first, again) {
		t.Error("same seed, different slots")
	}
}

func TestDeliver(t *testing.T) {
	batches := make([][]crdt.Slot, 100)
	for i := range batches {
		batches[i] = []crdt.Slot{slot("k", 0, "r", uint64(i+1))}
	}
	r := rand.New(rand.NewPCG(3, 4))
	if got := crdttest.Deliver(r, batches, crdttest.Faults{}); !slices.EqualFunc(got, batches, slices.Equal) {
		t.Error("no faults: batches changed")
	}
	if got := crdttest.Deliver(r, batches, crdttest.Faults{Drop: 1}); len(got) != 0 {
		t.Errorf("Drop 1: %d batches delivered", len(got))
	}
	got := crdttest.Deliver(r, batches, crdttest.Faults{Drop: 0.3, Duplicate: 0.5, Reorder: true})
	counts := map[uint64]int{}
	for _, b := range got {
		counts[b[0].Count]++
	}
	dups := 0
	for _, n := range counts {
		if n > 1 {
			dups++
		}
	}
	if len(counts) == len(batches) || dups == 0 || slices.IsSortedFunc(got, func(a, b []crdt.Slot) int { return int(a[0].Count) - int(b[0].Count) }) {
		t.Errorf("faults not applied: %d of %d batches arrived, %d duplicated, in order: %v",
			len(counts), len(batches), dups, got)
	}
}

func TestOracle(t *testing.T) {
	var o crdttest.Oracle
	o.Add("a", 0, 3)
	o.Add("a", 0, 4)
	o.Add("b", 60, 1)
	o.Add("c", 60, 0) // counting zero records nothing

	good := crdttest.FromSlots(slot("a", 0, "r0", 3), slot("a", 0, "r1", 4), slot("b", 60, "r0", 1))
	if err := o.Check(good); err != nil {
		t.Errorf("Check(good) = %v", err)
	}
	short := crdttest.FromSlots(slot("a", 0, "r0", 3), slot("b", 60, "r0", 1))
	if err := o.Check(short); err == nil || !strings.Contains(err.Error(), `key="a" window=0 is 3, counted 7`) {
		t.Errorf("Check(short) = %v", err)
	}
	extra := crdttest.Clone(good)
	extra.Join(slot("z", 0, "r0", 1))
	if err := o.Check(extra); err == nil || !strings.Contains(err.Error(), `nothing was counted for key="z"`) {
		t.Errorf("Check(extra) = %v", err)
	}
	o.DropBefore(60)
	good.DropBefore(60)
	if err := o.Check(good); err != nil {
		t.Errorf("after DropBefore: %v", err)
	}
}
