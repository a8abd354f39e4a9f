package core

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/region"
)

// Fixed instants, unix ns: t0 is when the core starts.
const (
	t0    = int64(1_700_000_000_000_000_000)
	flush = int64(100 * time.Millisecond)
	hello = int64(500 * time.Millisecond)
	bitIv = int64(10 * time.Millisecond)
)

// counts is a Counts over a crdt.Local; reads are logged so a test can see
// the order the core read them in.
type counts struct {
	l     *crdt.Local
	reads []string
}

func newCounts() *counts { return &counts{l: crdt.NewLocal("fra1")} }

func (c *counts) Delta() []crdt.Slot { c.reads = append(c.reads, "delta"); return c.l.Delta() }
func (c *counts) Own() []crdt.Slot   { c.reads = append(c.reads, "own"); return c.l.Slots() }

// bits is a Bits that hands out what a test issued.
type bits struct{ pending []crdt.Bit }

func (b *bits) BitsDelta() []crdt.Bit { out := b.pending; b.pending = nil; return out }
func (b *bits) issue(key string, scope uint8, until int64) {
	b.pending = append(b.pending, crdt.Bit{Key: key, Scope: scope, Until: until, Origin: "fra1"})
}

var twoRegions = region.Topology{Regions: map[string][]string{"eu": {"fra1", "par1"}, "us": {"iad1"}}}

func newCore(t *testing.T, c Counts, b Bits) *Core {
	t.Helper()
	cfg := Config{Region: "eu", POP: "fra1", Topology: twoRegions, Counts: c, SnapshotInterval: time.Hour}
	if b != nil {
		cfg.Bits = b
	}
	rc, err := New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// take returns the core's Ready (empty when it has none) and advances it.
func take(rc *Core) Ready {
	if !rc.HasReady() {
		return Ready{}
	}
	rd := rc.Ready()
	rc.Advance(rd)
	return rd
}

func kinds(rd Ready) []Kind {
	var out []Kind
	for _, m := range rd.Messages {
		out = append(out, m.Kind)
	}
	return out
}

func TestFlushScheduling(t *testing.T) {
	c := newCounts()
	rc := newCore(t, c, nil)
	for _, tt := range []struct {
		name      string
		at        int64
		add       uint64 // hits on key k before the tick
		want      []Kind
		saveDue   bool
		next      int64
		wantCount uint64 // the delta's count of k, when it has one
	}{
		{"t0 first beacon", t0, 0, []Kind{Hello}, false, t0 + flush, 0},
		{"t1 before the flush: nothing", t0 + flush - 1, 3, nil, false, t0 + flush, 0},
		{"t2 flush", t0 + flush, 0, []Kind{Delta}, true, t0 + 2*flush, 3},
		{"t3 flush with nothing new", t0 + 2*flush, 0, nil, true, t0 + 3*flush, 0},
		{"t4 late tick keeps the phase", t0 + 3*flush + flush/2, 2, []Kind{Delta}, true, t0 + 4*flush, 5},
		{"t5 beacon and flush together", t0 + hello, 1, []Kind{Hello, Delta}, true, t0 + 6*flush, 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.add > 0 {
				c.l.Add("k", 0, tt.add)
			}
			rc.Tick(tt.at)
			rd := take(rc)
			if got := kinds(rd); !slices.Equal(got, tt.want) {
				t.Fatalf("messages %v, want %v", got, tt.want)
			}
			if rd.SaveDue != tt.saveDue {
				t.Errorf("SaveDue %t, want %t", rd.SaveDue, tt.saveDue)
			}
			if got := rc.NextDeadline(); got != tt.next {
				t.Errorf("next deadline t0%+d, want t0%+d", got-t0, tt.next-t0)
			}
			for _, m := range rd.Messages {
				if m.Kind == Delta && (len(m.Slots) != 1 || m.Slots[0].Count != tt.wantCount) {
					t.Errorf("delta %v, want k at %d", m.Slots, tt.wantCount)
				}
			}
		})
	}
}

func TestRetryAfterFailed(t *testing.T) {
	c := newCounts()
	rc := newCore(t, c, nil)
	take(func() *Core { rc.Tick(t0); return rc }())
	c.l.Add("a", 0, 1)
	c.l.Add("b", 0, 2)
	rc.Tick(t0 + flush)
	rd := take(rc)
	rc.Failed(rd.Messages[0]) // not acknowledged
	if st := rc.Stats(); st.RetrySlots != 2 {
		t.Fatalf("retry set %d slots, want 2", st.RetrySlots)
	}
	c.l.Add("a", 0, 4) // a is now 5: the later value wins
	rc.Tick(t0 + 2*flush)
	rd = take(rc)
	got := map[string]uint64{}
	for _, s := range rd.Messages[0].Slots {
		got[s.Key] = s.Count
	}
	if want := map[string]uint64{"a": 5, "b": 2}; !reflect.DeepEqual(got, want) {
		t.Fatalf("retried delta %v, want %v", got, want)
	}
	if !slices.Equal(rd.Save, rd.Messages[0].Slots) {
		t.Fatalf("retried slots not saved again: save %v", rd.Save)
	}
	if st := rc.Stats(); st.RetrySlots != 0 {
		t.Fatalf("retry set %d slots after the retry, want 0", st.RetrySlots)
	}
}

// TestSaveBeforePublish: every own slot a Ready publishes, in a delta or a
// snapshot, is in that Ready's Save at a count at least as high.
func TestSaveBeforePublish(t *testing.T) {
	c := newCounts()
	cfg := Config{Region: "eu", POP: "fra1", Counts: c, SnapshotInterval: 2 * time.Duration(flush)}
	rc, err := New(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	take(func() *Core { rc.Tick(t0); return rc }())
	for i, at := range []int64{t0 + flush, t0 + 2*flush, t0 + 3*flush, t0 + 4*flush} {
		c.l.Add(fmt.Sprint("k", i%2), 0, uint64(i+1))
		c.reads = nil
		rc.Tick(at)
		rd := take(rc)
		saved := map[string]uint64{}
		for _, s := range rd.Save {
			saved[s.Key] = max(saved[s.Key], s.Count)
		}
		for _, m := range rd.Messages {
			if m.Kind == Snapshot && !slices.Equal(c.reads[:2], []string{"own", "delta"}) {
				t.Errorf("t0+%d: snapshot read %v; Own must come before the Delta whose save covers it", at-t0, c.reads)
			}
			for _, s := range m.Slots {
				if m.Kind == Delta && saved[s.Key] < s.Count {
					t.Errorf("t0+%d: %v publishes %s=%d, saved %d", at-t0, m.Kind, s.Key, s.Count, saved[s.Key])
				}
			}
		}
		if len(rd.Messages) == 0 || !rd.SaveDue {
			t.Errorf("t0+%d: no flush", at-t0)
		}
	}
}

func TestBitsRateLimit(t *testing.T) {
	b := &bits{}
	rc := newCore(t, newCounts(), b)
	take(func() *Core { rc.Tick(t0); return rc }())
	until := t0 + int64(time.Minute)
	for _, tt := range []struct {
		name  string
		issue bool  // issue a bit and call BitsIssued at `at`
		at    int64 // else Tick at `at`
		want  int   // bits messages out
		next  int64
	}{
		{"t1 first issue goes at once", true, t0 + 1, 1, t0 + flush},
		{"t2 second within the interval waits", true, t0 + 2, 0, t0 + 1 + bitIv},
		{"t3 third joins it", true, t0 + 3, 0, t0 + 1 + bitIv},
		{"t4 tick before the interval", false, t0 + bitIv, 0, t0 + 1 + bitIv},
		{"t5 the interval passed", false, t0 + 1 + bitIv, 1, t0 + flush},
		{"t6 after the interval at once", true, t0 + 1 + 2*bitIv, 1, t0 + flush},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.issue {
				b.issue(tt.name, region.ScopeGlobal, until)
				rc.BitsIssued(tt.at)
			} else {
				rc.Tick(tt.at)
			}
			rd := take(rc)
			if n := len(rd.Messages); n != tt.want {
				t.Fatalf("%d messages %v, want %d", n, kinds(rd), tt.want)
			}
			if got := rc.NextDeadline(); got != tt.next {
				t.Errorf("next deadline t0%+d, want t0%+d", got-t0, tt.next-t0)
			}
		})
	}
}

func TestUrgentRateLimit(t *testing.T) {
	c := newCounts()
	rc := newCore(t, c, nil)
	take(func() *Core { rc.Tick(t0); return rc }())
	c.l.Add("k", 0, 1)
	rc.Urgent(t0 + 1)
	if got := kinds(take(rc)); !slices.Equal(got, []Kind{Delta}) {
		t.Fatalf("urgent flush %v", got)
	}
	c.l.Add("k", 0, 1)
	rc.Urgent(t0 + 2)
	if rc.HasReady() || rc.NextDeadline() != t0+1+bitIv {
		t.Fatalf("second urgent within the interval went at once, or was not armed (next t0%+d)", rc.NextDeadline()-t0)
	}
	rc.Tick(t0 + 1 + bitIv)
	if rd := take(rc); len(rd.Messages) != 1 || rd.Messages[0].Slots[0].Count != 2 {
		t.Fatalf("armed urgent flush %v", rd.Messages)
	}
}

func TestSnapshotAfterBeaconGap(t *testing.T) {
	c := newCounts()
	rc := newCore(t, c, nil)
	c.l.Add("k", 0, 1)
	take(func() *Core { rc.Tick(t0); return rc }())
	beacon := func(at int64, seq uint64) { rc.Step(at, Message{Kind: Hello, Region: "us", POP: "iad1", Seq: seq}) }
	iv := int64(rc.Config().SnapshotInterval)
	at := t0
	for _, tt := range []struct {
		name     string
		wait     int64 // more time passes before the beacon
		seq      uint64
		snapshot bool // the next flush publishes a snapshot
	}{
		{"t1 a new PoP", 0, 10, true},
		{"t2 the next beacon", 0, 11, false},
		{"t3 a beacon went missing", 0, 13, true},
		{"t4 in order again", 0, 14, false},
		{"t5 another gap soon after", 0, 16, true},
		{"t6 a third gap soon after", 0, 18, false},
		{"t7 gaps again and again", 0, 20, false},
		{"t8 a snapshot interval later", iv, 22, true},
		{"t9 the PoP restarted, another interval later", iv, 5, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			at += hello + tt.wait
			beacon(at, tt.seq)
			take(rc)
			rc.Tick(at + flush)
			got := slices.Contains(kinds(take(rc)), Snapshot)
			if got != tt.snapshot {
				t.Fatalf("snapshot %t, want %t", got, tt.snapshot)
			}
			at += flush
		})
	}
}

// TestBeaconGapStorm: a PoP whose beacons skip a number every time — a
// flapping link, or a PoP forging them — makes this PoP publish at most two
// extra snapshots per snapshot interval, not one per beacon interval (which
// the probe of issue 12 measured as 10-15x the snapshot traffic).
func TestBeaconGapStorm(t *testing.T) {
	c := newCounts()
	rc := newCore(t, c, nil)
	c.l.Add("k", 0, 1)
	take(func() *Core { rc.Tick(t0); return rc }())
	iv := int64(rc.Config().SnapshotInterval)
	const intervals = 4
	snaps, beacons, at := 0, 0, t0
	for seq := uint64(1); at+hello+flush < t0+intervals*iv; seq += 2 { // every beacon skips one
		at += hello
		rc.Step(at, Message{Kind: Hello, Region: "us", POP: "iad1", Seq: seq})
		beacons++
		take(rc)
		rc.Tick(at + flush)
		if slices.Contains(kinds(take(rc)), Snapshot) {
			snaps++
		}
		at += flush
	}
	// The periodic one per interval, the new PoP's, two at once and then one
	// per interval for the gaps.
	if want := intervals + 1 + 2 + (intervals - 1); snaps > want {
		t.Fatalf("%d snapshots over %d snapshot intervals of %d gapped beacons, want at most %d", snaps, intervals, beacons, want)
	}
	t.Logf("%d snapshots over %d snapshot intervals of %d gapped beacons", snaps, intervals, beacons)
}

func TestReachabilityShare(t *testing.T) {
	rc := newCore(t, newCounts(), nil)
	take(func() *Core { rc.Tick(t0); return rc }())
	ua := int64(DefaultUnreachableAfter)
	if got := rc.NextDeadline(); got != t0+flush {
		t.Fatalf("next deadline t0%+d", got-t0)
	}
	for _, tt := range []struct {
		name   string
		heard  bool // a us beacon arrives at `at`; else a tick
		at     int64
		share  float64
		cut    []string
		change bool
	}{
		{"t1 us heard", true, t0 + 1, 0, nil, false},
		{"t2 just within", false, t0 + 1 + ua, 0, nil, false},
		{"t3 cut off", false, t0 + 2 + ua, 0.5, []string{"us"}, true},
		{"t4 still cut", false, t0 + 3 + ua, 0, nil, false},
		{"t5 heard again", true, t0 + 4 + ua, 1, nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.heard {
				rc.Step(tt.at, Message{Kind: Hello, Region: "us", POP: "iad1", Seq: uint64(tt.at)})
			} else {
				rc.Tick(tt.at)
			}
			rd := take(rc)
			if rd.Share != tt.share || rd.UnreachableChanged != tt.change || !slices.Equal(rd.Unreachable, tt.cut) {
				t.Fatalf("share %v unreachable %v (changed %t), want %v %v (%t)", rd.Share, rd.Unreachable, rd.UnreachableChanged, tt.share, tt.cut, tt.change)
			}
		})
	}
	if got, want := rc.NextDeadline(), t0+4+2*ua+1; got > want {
		t.Fatalf("next deadline t0%+d, want by t0%+d (when us times out)", got-t0, want-t0)
	}
}

func TestBitFilter(t *testing.T) {
	rc := newCore(t, newCounts(), &bits{})
	now := t0 + 1
	later := now + int64(time.Minute)
	in := []struct {
		name string
		from string // region of the sender
		bit  crdt.Bit
		drop region.BitDrop
		kept bool
	}{
		{"global from another region", "us", crdt.Bit{Key: "a", Scope: region.ScopeGlobal, Until: later, Origin: "iad1"}, 0, true},
		{"region bit of this region", "eu", crdt.Bit{Key: "b", Scope: region.ScopeRegion, Until: later, Origin: "par1"}, 0, true},
		{"region bit of another region", "us", crdt.Bit{Key: "c", Scope: region.ScopeRegion, Until: later, Origin: "iad1"}, region.BitDropRegion, false},
		{"pop scope", "eu", crdt.Bit{Key: "d", Scope: region.ScopePOP, Until: later, Origin: "par1"}, region.BitDropScope, false},
		{"unknown scope", "eu", crdt.Bit{Key: "e", Scope: 255, Until: later, Origin: "par1"}, region.BitDropScope, false},
		{"own, relayed back", "us", crdt.Bit{Key: "f", Scope: region.ScopeGlobal, Until: later, Origin: "fra1"}, -1, false}, // RejectSender: see TestRejects
		{"expired", "us", crdt.Bit{Key: "g", Scope: region.ScopeGlobal, Until: now, Origin: "iad1"}, region.BitDropExpired, false},
	}
	for _, tt := range in {
		t.Run(tt.name, func(t *testing.T) {
			pop := map[string]string{"us": "iad1", "eu": "par1"}[tt.from]
			rc.Step(now, Message{Kind: BitsBatch, Region: tt.from, POP: pop, Sent: now - 5, Bits: []crdt.Bit{tt.bit}})
			rd := take(rc)
			kept := len(rd.Apply) == 1 && len(rd.Apply[0].Bits) == 1
			if kept != tt.kept {
				t.Fatalf("kept %t, want %t (ready %+v)", kept, tt.kept, rd)
			}
			if kept && rd.Apply[0].Issued[0] != now-5 {
				t.Errorf("issued %d, want the batch's stamp", rd.Apply[0].Issued[0])
			}
			if !kept && tt.drop >= 0 && rd.DroppedBits[tt.drop] != 1 {
				t.Errorf("dropped %v, want one %v", rd.DroppedBits, tt.drop)
			}
		})
	}
	// Without Bits, none is applied nor counted.
	off := newCore(t, newCounts(), nil)
	off.Step(now, Message{Kind: BitsBatch, Region: "us", POP: "iad1", Bits: []crdt.Bit{in[0].bit}})
	if off.HasReady() {
		t.Fatal("a core without Bits took a bit")
	}
}

// TestDeterminism runs one script twice on fresh cores and expects the very
// same Readys.
func TestDeterminism(t *testing.T) {
	script := func() []Ready {
		c, b := newCounts(), &bits{}
		rc := newCore(t, c, b)
		var out []Ready
		for i := range 200 {
			at := t0 + int64(i)*7*int64(time.Millisecond)
			c.l.Add(fmt.Sprint("k", i%13), int64(i/50), uint64(i%3+1))
			switch i % 7 {
			case 0:
				b.issue(fmt.Sprint("b", i%5), region.ScopeGlobal, at+int64(time.Second))
				rc.BitsIssued(at)
			case 3:
				rc.Step(at, Message{Kind: Hello, Region: "us", POP: "iad1", Seq: uint64(i / 3)})
			case 5:
				rc.Step(at, Message{Kind: Delta, Region: "us", POP: "iad1", Sent: at - 40, Slots: []crdt.Slot{{Key: "r", Replica: "iad1", Count: uint64(i)}}})
			}
			if i%11 == 0 {
				for rc.HasReady() {
					rd := rc.Ready()
					for _, m := range rd.Messages {
						if m.Kind == Delta && i%2 == 0 {
							rc.Failed(m)
						}
					}
					rc.Advance(rd)
					out = append(out, rd)
				}
			}
			rc.Tick(min(at, rc.NextDeadline()))
			rc.Tick(at)
			if rd := take(rc); !rd.empty() {
				out = append(out, rd)
			}
		}
		return out
	}
	a, b := script(), script()
	if len(a) == 0 || !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs of one script differ (%d and %d Readys)", len(a), len(b))
	}
}

func TestConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no PoP":           {Region: "eu", Counts: newCounts()},
		"no counts":        {Region: "eu", POP: "fra1"},
		"region not in it": {Region: "ap", POP: "fra1", Topology: twoRegions, Counts: newCounts()},
		"PoP elsewhere":    {Region: "us", POP: "fra1", Topology: twoRegions, Counts: newCounts()},
		"negative flush":   {Region: "eu", POP: "fra1", Counts: newCounts(), FlushInterval: -1},
		"share above 1":    {Region: "eu", POP: "fra1", Counts: newCounts(), PartitionShare: 1.5},
	} {
		if _, err := New(cfg, t0); err == nil {
			t.Errorf("%s: New accepted the config", name)
		}
	}
}
