package replication_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	edgelimitpb "github.com/edgelimit/edgelimit/proto"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// Bit scopes as limit numbers them.
const (
	scopeRegion = 1
	scopeGlobal = 2
)

// memBits is a PoP's mitigation bit table as replication sees it, kept in a
// crdt.Bits under a mutex, with the bits issued since the last BitsDelta.
type memBits struct {
	pop   string
	mu    sync.Mutex
	table crdt.Bits
	delta []crdt.Bit
}

// Issue raises (or extends) a bit of this PoP for key in scope until until,
// for the next BitsDelta. It is published even when the table holds a later
// bit, so tests can send an earlier Until.
func (b *memBits) Issue(key string, scope uint8, until time.Time) crdt.Bit {
	bit := crdt.Bit{Key: key, Scope: scope, Until: until.UnixNano(), Origin: b.pop}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.table.Join(bit)
	b.delta = append(b.delta, bit)
	return bit
}

func (b *memBits) BitsDelta() []crdt.Bit {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.delta
	b.delta = nil
	return d
}

func (b *memBits) ApplyBits(bits []crdt.Bit) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.table.Join(bits...)
}

func (b *memBits) Get(key string, scope uint8) (crdt.Bit, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.table.Get(key, scope)
}

// bitPoP is a running PoP with a bit table.
type bitPoP struct {
	*pop
	bits *memBits
}

// startBitPoP starts a replicator for PoP name of region with a memBits.
func startBitPoP(t testing.TB, c *natstest.Cluster, topo replication.Topology, region, name string) *bitPoP {
	t.Helper()
	bits := &memBits{pop: name}
	p := startPoP(t, c, topo, region, name, nil, func(cfg *replication.Config) { cfg.Bits = bits })
	return &bitPoP{p, bits}
}

// hasBit returns nil once p holds want (the same Until and origin).
func hasBit(p *bitPoP, want crdt.Bit) error {
	got, ok := p.bits.Get(want.Key, want.Scope)
	if !ok {
		return fmt.Errorf("%s: no bit for %q scope %d", p.name, want.Key, want.Scope)
	}
	if got != want {
		return fmt.Errorf("%s: holds %v, want %v", p.name, got, want)
	}
	return nil
}

// waitBit waits until every one of pops holds want, failing the test after
// timeout, and returns how long it took.
func waitBit(t *testing.T, timeout time.Duration, want crdt.Bit, pops ...*bitPoP) time.Duration {
	t.Helper()
	took, err := waitFor(timeout, func() error {
		for _, p := range pops {
			if err := hasBit(p, want); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("bit %v not everywhere after %v: %v", want, took, err)
	}
	return took
}

func startBitRegions(t *testing.T) (*natstest.Cluster, map[string]*bitPoP) {
	t.Helper()
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}, "us": {"iad1", "sfo1"}})
	c := natstest.StartRegions(t, "eu", "us")
	pops := map[string]*bitPoP{}
	for _, region := range []string{"eu", "us"} {
		for _, name := range topo.Regions[region] {
			pops[name] = startBitPoP(t, c, topo, region, name)
		}
	}
	return c, pops
}

// TestBitsPropagation: two regions of two PoPs each. A global bit reaches
// the three other PoPs within a second; a region bit only the other PoP of
// its region; a later Until extends a bit everywhere, an earlier one does not
// shorten it.
func TestBitsPropagation(t *testing.T) {
	_, pops := startBitRegions(t)
	fra, par, iad, sfo := pops["fra1"], pops["par1"], pops["iad1"], pops["sfo1"]
	now := time.Now()

	global := fra.bits.Issue("api_key=abc", scopeGlobal, now.Add(time.Minute))
	took := waitBit(t, time.Second, global, par, iad, sfo)
	t.Logf("global bit everywhere %v after it was issued (flush interval 100 ms)", took)

	region := iad.bits.Issue("ip=10.0.0.1", scopeRegion, now.Add(time.Minute))
	took = waitBit(t, time.Second, region, sfo)
	t.Logf("region bit at the other PoP of its region %v after it was issued", took)
	// The eu PoPs read the bit from their stream (sourced) and drop it.
	for _, p := range []*bitPoP{fra, par} {
		if _, err := waitFor(2*time.Second, func() error {
			if n := p.rep.Stats().DroppedBits[replication.BitDropRegion]; n == 0 {
				return fmt.Errorf("%s: dropped no other-region bit", p.name)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		if b, ok := p.bits.Get(region.Key, region.Scope); ok {
			t.Errorf("%s: holds the us region bit %v", p.name, b)
		}
	}

	// A later Until, from another PoP, extends the bit everywhere.
	later := sfo.bits.Issue(global.Key, scopeGlobal, now.Add(2*time.Minute))
	took = waitBit(t, time.Second, later, fra, par, iad)
	t.Logf("extension everywhere %v after it was issued", took)

	// An earlier Until does not shorten it: once par's bit is applied
	// everywhere, every PoP still holds the later one.
	before := map[string]uint64{}
	for _, p := range []*bitPoP{fra, iad, sfo} {
		before[p.name] = p.rep.Stats().AppliedBits
	}
	par.bits.Issue(global.Key, scopeGlobal, now.Add(90*time.Second))
	if _, err := waitFor(time.Second, func() error {
		for _, p := range []*bitPoP{fra, iad, sfo} {
			if p.rep.Stats().AppliedBits <= before[p.name] {
				return fmt.Errorf("%s: the earlier bit not applied yet", p.name)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*bitPoP{fra, par, iad, sfo} {
		if err := hasBit(p, later); err != nil {
			t.Error(err)
		}
	}

	for _, name := range []string{"fra1", "par1", "iad1", "sfo1"} {
		st := pops[name].rep.Stats()
		t.Logf("%s: published %d bits in %d batches, applied %d (%d from snapshots), dropped %v, propagation p50 %v p99 %v max %v over %d",
			name, st.PublishedBits, st.PublishedBitBatches, st.AppliedBits, st.AppliedSnapshotBits, st.DroppedBits,
			st.BitLag.P50, st.BitLag.P99, st.BitLag.Max, st.BitLag.Count)
		if st.PublishFailures != 0 || st.DroppedTotal() != 0 {
			t.Errorf("%s: stats %+v", name, st)
		}
	}
}

// TestBitsPartition: a global bit issued while the link between the regions
// is cut reaches the other region within 2 s of the heal.
func TestBitsPartition(t *testing.T) {
	c, pops := startBitRegions(t)
	fra, par, iad, sfo := pops["fra1"], pops["par1"], pops["iad1"], pops["sfo1"]
	// Links work: a first bit crosses.
	waitBit(t, time.Second, fra.bits.Issue("warmup", scopeGlobal, time.Now().Add(time.Minute)), iad, sfo)

	c.Cut()
	cutAt := time.Now()
	bit := fra.bits.Issue("api_key=cut", scopeGlobal, time.Now().Add(time.Minute))
	waitBit(t, time.Second, bit, par) // its own region has it
	time.Sleep(time.Second)
	for _, p := range []*bitPoP{iad, sfo} {
		if hasBit(p, bit) == nil {
			t.Fatalf("%s got the bit during the cut: the link was not cut", p.name)
		}
	}
	// Each side knows the other is cut off (no beacons for over 800 ms),
	// and its own region's PoPs are still heard.
	if got := fra.rep.Unreachable(time.Now(), 800*time.Millisecond); len(got) != 1 || got[0] != "us" {
		t.Fatalf("fra1 during the cut: unreachable %v, want [us]", got)
	}
	if got := iad.rep.Unreachable(time.Now(), 800*time.Millisecond); len(got) != 1 || got[0] != "eu" {
		t.Fatalf("iad1 during the cut: unreachable %v, want [eu]", got)
	}
	healAt := time.Now()
	c.Heal()
	took := waitBit(t, 2*time.Second, bit, iad, sfo)
	for deadline := time.Now().Add(3 * time.Second); len(fra.rep.Unreachable(time.Now(), 800*time.Millisecond)) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("fra1 still finds %v unreachable 3 s after the heal", fra.rep.Unreachable(time.Now(), 800*time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("bit across regions %v after the heal (cut lasted %v)", took, healAt.Sub(cutAt))
	for _, p := range []*bitPoP{iad, sfo} {
		st := p.rep.Stats()
		t.Logf("%s: applied %d bits (%d from snapshots), dropped %v", p.name, st.AppliedBits, st.AppliedSnapshotBits, st.DroppedBits)
	}
}

// TestBitsCorrupt: bit messages that do not decode, fail Validate, need a
// newer schema or name another PoP are dropped and counted, and so are bits
// of unknown scope, already expired or of the receiver's own origin; valid
// bits of the same message are applied.
func TestBitsCorrupt(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1", "x1"}}) // x1: a PoP that misbehaves
	fra := startBitPoP(t, c, topo, "eu", "fra1")
	par := startBitPoP(t, c, topo, "eu", "par1")
	nc := c.Connect(t, "eu")

	until := time.Now().Add(time.Minute).UnixNano()
	bit := func(key string, scope uint32, until int64, origin string) *edgelimitpb.MitigationBit {
		return &edgelimitpb.MitigationBit{Key: []byte(key), Scope: scope, UntilUnixNano: until, Origin: origin, IssuedUnixNano: time.Now().UnixNano()}
	}
	evil := func() *edgelimitpb.MitigationBatch {
		return &edgelimitpb.MitigationBatch{Replica: "x1", Bits: []*edgelimitpb.MitigationBit{bit("evil", scopeGlobal, until, "x1")}}
	}
	noReplica := evil()
	noReplica.Replica = ""
	newer := evil()
	newer.RequiredRevision = edgelimitpb.Revision + 1
	wrongPoP := evil()
	wrongPoP.Replica = "x2"
	subject := replication.BitsSubject("eu", "x1")
	cases := []struct {
		data   []byte
		reason replication.DropReason
	}{
		{[]byte("\xff\xff\xff garbage \x00\x01"), replication.DropDecode},
		{[]byte{0x12, 0xff}, replication.DropDecode}, // truncated
		{marshal(t, noReplica), replication.DropInvalid},
		{marshal(t, newer), replication.DropRevision},
		{marshal(t, wrongPoP), replication.DropMismatch},
	}
	var want [replication.NumDropReasons]uint64
	for _, tc := range cases {
		publishRaw(t, nc, subject, tc.data)
		want[tc.reason]++
	}
	// One valid message: two good bits and four that must not be applied.
	mixed := &edgelimitpb.MitigationBatch{Replica: "x1", Bits: []*edgelimitpb.MitigationBit{
		bit("good", scopeGlobal, until, "x1"),
		bit("good-region", scopeRegion, until, ""), // no origin: the sender's
		bit("pop-scope", 0, until, "x1"),
		bit("unknown-scope", 300, until, "x1"),
		bit("expired", scopeGlobal, time.Now().Add(-time.Second).UnixNano(), "x1"),
		bit("relayed", scopeGlobal, until, "fra1"), // not x1's own: rejected (RejectSender)
	}}
	publishRaw(t, nc, subject, marshal(t, mixed))

	for _, p := range []*bitPoP{fra, par} {
		wantBits := [replication.NumBitDropReasons]uint64{
			replication.BitDropScope:   2,
			replication.BitDropExpired: 1,
		}
		applied := uint64(2)
		var rejected [replication.NumRejectReasons]uint64
		rejected[replication.RejectSender] = 1
		if _, err := waitFor(3*time.Second, func() error {
			st := p.rep.Stats()
			if st.Rejected != rejected {
				return fmt.Errorf("rejected %v, want %v", st.Rejected, rejected)
			}
			if st.Dropped != want || st.DroppedBits != wantBits || st.AppliedBits != applied {
				return fmt.Errorf("dropped %v, bits dropped %v, applied %d; want %v, %v, %d",
					st.Dropped, st.DroppedBits, st.AppliedBits, want, wantBits, applied)
			}
			return nil
		}); err != nil {
			t.Errorf("%s: %v", p.name, err)
		}
		if b, ok := p.bits.Get("evil", scopeGlobal); ok {
			t.Errorf("%s: a dropped message was applied: %v", p.name, b)
		}
		for _, key := range []string{"pop-scope", "expired"} {
			for scope := range uint8(3) {
				if b, ok := p.bits.Get(key, scope); ok {
					t.Errorf("%s: a dropped bit was applied: %v", p.name, b)
				}
			}
		}
		if err := hasBit(p, crdt.Bit{Key: "good-region", Scope: scopeRegion, Until: until, Origin: "x1"}); err != nil {
			t.Error(err)
		}
	}
	// Bits go on.
	b := fra.bits.Issue("after", scopeGlobal, time.Now().Add(time.Minute))
	waitBit(t, time.Second, b, par)
}

// TestBitsSnapshot: a PoP that starts after a bit was published, past it in
// the stream, learns the still active bit from the issuer's snapshot (which
// the newcomer's first presence beacon triggers), not from the batch.
func TestBitsSnapshot(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}})
	fra := startBitPoP(t, c, topo, "eu", "fra1")
	b := fra.bits.Issue("api_key=old", scopeGlobal, time.Now().Add(time.Minute))
	if _, err := waitFor(time.Second, func() error {
		// The read-back is counted as it arrives, its sequence once the
		// run loop takes it: par1 must start past the batch.
		if st := fra.rep.Stats(); st.PublishedBits == 0 || st.SkippedOwn == 0 || st.LastAppliedSeq == 0 {
			return fmt.Errorf("bit not published and read back yet: %+v", st)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	start := fra.rep.Stats().LastAppliedSeq
	bits := &memBits{pop: "par1"}
	par := &bitPoP{startPoP(t, c, topo, "eu", "par1", nil, func(cfg *replication.Config) {
		cfg.Bits = bits
		cfg.StartSeq = start
	}), bits}
	took := waitBit(t, 2*time.Second, b, par)
	st := par.rep.Stats()
	if st.AppliedSnapshotBits == 0 || st.AppliedBits != st.AppliedSnapshotBits {
		t.Errorf("par1: applied %d bits, %d from snapshots; want all from snapshots", st.AppliedBits, st.AppliedSnapshotBits)
	}
	t.Logf("a PoP started past the batch learned the bit from a snapshot %v after it started", took)
	// fra1 counts a snapshot published once the stream has acknowledged it,
	// which can be after par1 has read it.
	if _, err := waitFor(time.Second, func() error {
		if fra.rep.Stats().PublishedSnapshotBits == 0 {
			return errors.New("fra1: published no snapshot bits")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// notifyBits is a memBits that tells when it issues (replication.BitsNotifier).
type notifyBits struct {
	*memBits
	issued chan struct{}
}

func (n *notifyBits) Issue(key string, scope uint8, until time.Time) crdt.Bit {
	b := n.memBits.Issue(key, scope, until)
	select {
	case n.issued <- struct{}{}:
	default:
	}
	return b
}

func (n *notifyBits) BitsIssued() <-chan struct{} { return n.issued }

// TestBitsPublishedOnIssue: with a BitsNotifier, a bit goes out when it is
// issued, not with the next flush. Flushes every 10 s and snapshots every
// 30 s here, so a bit that reaches the other region within 2 s of its issue
// can only have been published on issue.
func TestBitsPublishedOnIssue(t *testing.T) {
	topo := topology(map[string][]string{"eu": {"fra1"}, "us": {"iad1"}})
	c := natstest.StartRegions(t, "eu", "us")
	bits := map[string]*notifyBits{}
	for _, region := range []string{"eu", "us"} {
		name := topo.Regions[region][0]
		nb := &notifyBits{memBits: &memBits{pop: name}, issued: make(chan struct{}, 1)}
		bits[name] = nb
		startPoP(t, c, topo, region, name, nil, func(cfg *replication.Config) {
			cfg.Bits = nb
			cfg.FlushInterval, cfg.SnapshotInterval = 10*time.Second, 30*time.Second
		})
	}
	time.Sleep(1500 * time.Millisecond) // let the start-up snapshots go by
	for i := range 3 {
		issued := time.Now()
		want := bits["fra1"].Issue(fmt.Sprintf("key-%d", i), scopeGlobal, issued.Add(time.Minute))
		took, err := waitFor(2*time.Second, func() error {
			got, ok := bits["iad1"].Get(want.Key, want.Scope)
			if !ok || got != want {
				return fmt.Errorf("iad1 holds %v (%v), want %v", got, ok, want)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("bit %d not across within 2 s of its issue (flush interval 10 s): %v", i, err)
		}
		t.Logf("bit %d at the other region %v after its issue", i, took)
	}
}
