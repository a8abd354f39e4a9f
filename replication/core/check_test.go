package core

import (
	"slices"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/region"
)

// fixedBounds bounds every key alike; key "pop" is never replicated.
type fixedBounds struct {
	count uint64
	bit   time.Duration
}

func (b fixedBounds) MaxCount(key string) uint64 {
	if key == "pop" {
		return 0
	}
	return b.count
}
func (b fixedBounds) MaxBit(string) time.Duration { return b.bit }

// TestRejects walks the probes of issue 12 through Step: what a forged or
// impossible message becomes, and how it is counted.
func TestRejects(t *testing.T) {
	now := t0 + 1
	const bound = 400
	bitMax := time.Hour
	far := now + int64(100*365*24*time.Hour) // a bit ending a century out
	slot := func(key, replica string, n uint64) crdt.Slot {
		return crdt.Slot{Key: key, Window: 0, Replica: replica, Count: n}
	}
	gbit := func(key, origin string, until int64) crdt.Bit {
		return crdt.Bit{Key: key, Scope: region.ScopeGlobal, Until: until, Origin: origin}
	}
	for _, tt := range []struct {
		name   string
		m      Message
		reject Reject
		n      int         // rejects of that reason
		slots  []crdt.Slot // applied
		bits   []crdt.Bit  // applied
	}{
		{"honest delta", Message{Kind: Delta, Region: "us", POP: "iad1", Slots: []crdt.Slot{slot("k", "iad1", bound)}},
			0, 0, []crdt.Slot{slot("k", "iad1", bound)}, nil},
		{"2^40 count", Message{Kind: Delta, Region: "us", POP: "iad1", Slots: []crdt.Slot{slot("a", "iad1", 5), slot("k", "iad1", 1<<40)}},
			RejectCount, 1, []crdt.Slot{slot("a", "iad1", 5), slot("k", "iad1", bound)}, nil},
		{"count of a key no PoP replicates", Message{Kind: Snapshot, Region: "us", POP: "iad1", Slots: []crdt.Slot{slot("pop", "iad1", 7), slot("a", "iad1", 5)}},
			RejectCount, 1, []crdt.Slot{slot("a", "iad1", 5)}, nil},
		{"replica outside the topology", Message{Kind: Delta, Region: "us", POP: "evil9", Slots: []crdt.Slot{slot("k", "evil9", 3)}},
			RejectReplica, 1, nil, nil},
		{"PoP naming another region", Message{Kind: Delta, Region: "eu", POP: "iad1", Slots: []crdt.Slot{slot("k", "iad1", 3)}},
			RejectReplica, 1, nil, nil},
		{"slot of another replica", Message{Kind: Delta, Region: "us", POP: "iad1", Slots: []crdt.Slot{slot("k", "par1", 3), slot("a", "iad1", 1)}},
			RejectSender, 1, []crdt.Slot{slot("a", "iad1", 1)}, nil},
		{"100-year bit", Message{Kind: BitsBatch, Region: "us", POP: "iad1", Bits: []crdt.Bit{gbit("k", "iad1", far)}},
			RejectBitEnd, 1, nil, []crdt.Bit{gbit("k", "iad1", now+int64(bitMax))}},
		{"bit of another origin", Message{Kind: BitsBatch, Region: "us", POP: "iad1", Bits: []crdt.Bit{gbit("k", "par1", now+5)}},
			RejectSender, 1, nil, nil},
		{"honest bit", Message{Kind: BitsBatch, Region: "us", POP: "iad1", Bits: []crdt.Bit{gbit("k", "iad1", now+5)}},
			0, 0, nil, []crdt.Bit{gbit("k", "iad1", now+5)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Region: "eu", POP: "fra1", Topology: twoRegions, Counts: newCounts(), Bits: &bits{},
				Bounds: fixedBounds{bound, bitMax}}
			rc, err := New(cfg, t0)
			if err != nil {
				t.Fatal(err)
			}
			take(rc)
			sent := slices.Clone(tt.m.Slots)
			sentBits := slices.Clone(tt.m.Bits)
			rc.Step(now, tt.m)
			rd := take(rc)
			var slots []crdt.Slot
			var bs []crdt.Bit
			for _, a := range rd.Apply {
				slots = append(slots, a.Slots...)
				bs = append(bs, a.Bits...)
			}
			if !slices.Equal(slots, tt.slots) || !slices.Equal(bs, tt.bits) {
				t.Errorf("applied %v %v, want %v %v", slots, bs, tt.slots, tt.bits)
			}
			var want [NumRejects]int
			want[tt.reject] = tt.n
			if rd.Rejected != want {
				t.Errorf("rejected %v, want %v", rd.Rejected, want)
			}
			if tt.n > 0 && rd.RejectedWhy[tt.reject] == "" {
				t.Errorf("no description of the %v reject", tt.reject)
			}
			if !slices.Equal(tt.m.Slots, sent) || !slices.Equal(tt.m.Bits, sentBits) {
				t.Error("Step changed the message it was given (the simulator hands one to several cores)")
			}
		})
	}
}

// TestForgedBeaconKeepsRegionCut: a beacon that names a cut-off region
// but comes from a PoP of another region does not make that region
// reachable again, so the partition share holds.
func TestForgedBeaconKeepsRegionCut(t *testing.T) {
	rc := newCore(t, newCounts(), nil)
	take(func() *Core { rc.Tick(t0); return rc }())
	cut := t0 + int64(DefaultUnreachableAfter) + 1
	rc.Tick(cut)
	if rd := take(rc); rd.Share != 0.5 {
		t.Fatalf("share %v after us went quiet, want 0.5", rd.Share)
	}
	// par1 (eu) forges a beacon of region us, then one names a PoP outside
	// the topology.
	rc.Step(cut+1, Message{Kind: Hello, Region: "us", POP: "par1", Seq: 1})
	rc.Step(cut+2, Message{Kind: Hello, Region: "us", POP: "iad9", Seq: 1})
	rd := take(rc)
	if rd.Share != 0 || rd.UnreachableChanged {
		t.Fatalf("forged beacons changed the share to %v (unreachable %v)", rd.Share, rd.Unreachable)
	}
	if rd.Rejected[RejectReplica] != 2 {
		t.Fatalf("rejected %v, want 2 unknown_replica", rd.Rejected)
	}
	// The real one does.
	rc.Step(cut+3, Message{Kind: Hello, Region: "us", POP: "iad1", Seq: 1})
	if rd := take(rc); rd.Share != 1 {
		t.Fatalf("share %v after iad1's own beacon, want 1", rd.Share)
	}
}

// flooredBounds is a fixedBounds with a CountFloor, counting its lookups.
type flooredBounds struct {
	fixedBounds
	floor   uint64
	lookups *int
}

func (b flooredBounds) CountFloor() uint64 { return b.floor }
func (b flooredBounds) MaxCount(key string) uint64 {
	*b.lookups++
	return b.fixedBounds.MaxCount(key)
}

// TestCountFloor: counts at or under the floor are applied without looking
// their bound up; above it, the bound holds as before.
func TestCountFloor(t *testing.T) {
	lookups := 0
	cfg := Config{Region: "eu", POP: "fra1", Topology: twoRegions, Counts: newCounts(),
		Bounds: flooredBounds{fixedBounds{400, time.Hour}, 20, &lookups}}
	rc, err := New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	take(rc)
	slots := []crdt.Slot{{Key: "a", Replica: "iad1", Count: 20}, {Key: "b", Replica: "iad1", Count: 21}, {Key: "c", Replica: "iad1", Count: 1 << 40}}
	rc.Step(t0+1, Message{Kind: Delta, Region: "us", POP: "iad1", Slots: slots})
	rd := take(rc)
	want := []crdt.Slot{slots[0], slots[1], {Key: "c", Replica: "iad1", Count: 400}}
	if len(rd.Apply) != 1 || !slices.Equal(rd.Apply[0].Slots, want) {
		t.Fatalf("applied %v, want %v", rd.Apply, want)
	}
	if lookups != 2 || rd.Rejected[RejectCount] != 1 {
		t.Fatalf("%d lookups (want 2: the counts over the floor), rejected %v", lookups, rd.Rejected)
	}
}

// TestBeaconApplied: a presence beacon of a PoP of the topology reaches the
// driver as an Apply of kind Hello, with neither slots nor bits (for
// replication.BeaconCounts); a forged one does not.
func TestBeaconApplied(t *testing.T) {
	rc := newCore(t, newCounts(), nil)
	take(func() *Core { rc.Tick(t0); return rc }())
	rc.Step(t0+1, Message{Kind: Hello, Region: "us", POP: "iad1", Seq: 1, Sent: t0})
	rc.Step(t0+2, Message{Kind: Hello, Region: "us", POP: "par1", Seq: 1, Sent: t0})
	rd := take(rc)
	if len(rd.Apply) != 1 {
		t.Fatalf("applies %+v, want one: iad1's beacon", rd.Apply)
	}
	if a := rd.Apply[0]; a.Kind != Hello || a.POP != "iad1" || a.Region != "us" || len(a.Slots) != 0 || len(a.Bits) != 0 {
		t.Fatalf("apply %+v, want iad1's beacon without slots or bits", a)
	}
}
