package replication_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/crdt/crdttest"
	edgelimitpb "github.com/edgelimit/edgelimit/proto"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

var seedFlag = flag.Uint64("seed", 0, "seed for the random adds; 0 picks one (printed)")

// w0 is the window every test counts in.
const w0 = int64(1_700_000_040_000_000_000)

// memCounts is a PoP's counter store as replication sees it, kept in memory:
// the PoP's own counts in a crdt.Local, everything heard from other PoPs in a
// crdt.Counters, one mutex over both.
type memCounts struct {
	mu     sync.Mutex
	own    *crdt.Local
	remote crdt.Counters
	// applied, when set before the replicator starts, sees every Apply's
	// slots after they were joined.
	applied func([]crdt.Slot)
	// hot, when set before the replicator starts, tells the keys near their
	// limit (replication.HotCounts); none when nil.
	hot func(key string) bool
	// beacons counts the presence beacons heard, by PoP
	// (replication.BeaconCounts).
	beacons map[string]int
}

// Beacon counts a presence beacon of pop.
func (c *memCounts) Beacon(pop string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.beacons == nil {
		c.beacons = make(map[string]int)
	}
	c.beacons[pop]++
}

// beaconsOf returns how many beacons of pop c heard.
func (c *memCounts) beaconsOf(pop string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.beacons[pop]
}

// Hot returns the slots whose keys c.hot names.
func (c *memCounts) Hot(slots []crdt.Slot) []crdt.Slot {
	var out []crdt.Slot
	for _, s := range slots {
		if c.hot != nil && c.hot(s.Key) {
			out = append(out, s)
		}
	}
	return out
}

var _ replication.Counts = (*memCounts)(nil)

func newMemCounts(pop string) *memCounts { return &memCounts{own: crdt.NewLocal(pop)} }

func (c *memCounts) Add(key string, window int64, n uint64) {
	c.mu.Lock()
	c.own.Add(key, window, n)
	c.mu.Unlock()
}

func (c *memCounts) Delta() []crdt.Slot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.own.Delta()
}

func (c *memCounts) Own() []crdt.Slot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.own.Slots()
}

func (c *memCounts) Restore(own []crdt.Slot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.own.Restore(own...)
}

func (c *memCounts) Apply(_ int64, remote []crdt.Slot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	me := c.own.Replica()
	if slices.ContainsFunc(remote, func(s crdt.Slot) bool { return s.Replica == me }) {
		remote = slices.DeleteFunc(slices.Clone(remote), func(s crdt.Slot) bool { return s.Replica == me })
	}
	c.remote.Join(remote...)
	if c.applied != nil {
		c.applied(remote)
	}
}

func (c *memCounts) Remote() []crdt.Slot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.remote.Slots()
}

func (c *memCounts) DropBefore(window int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.own.DropBefore(window)
	c.remote.DropBefore(window)
}

// State returns everything the PoP knows, its own counts included, as one
// Counters.
func (c *memCounts) State() *crdt.Counters {
	c.mu.Lock()
	defer c.mu.Unlock()
	return crdttest.FromSlots(slices.Concat(c.own.Slots(), c.remote.Slots())...)
}

// pop is one running PoP in a test: its store and its replicator.
type pop struct {
	name, region string
	counts       *memCounts
	rep          *replication.Replicator
	stop         func() // stops the replicator and waits for Run to return
}

// topology returns the topology of regions, each mapped to its PoPs.
func topology(regions map[string][]string) replication.Topology {
	return replication.Topology{Regions: regions}
}

// startPoP starts a replicator for PoP name of region on the cluster, over
// counts (a new store when nil), with the default config changed by tune
// (when not nil), and waits until it consumes its region's stream. Cleanup
// stops it.
func startPoP(t testing.TB, c *natstest.Cluster, topo replication.Topology, region, name string, counts *memCounts, tune func(*replication.Config)) *pop {
	t.Helper()
	if counts == nil {
		counts = newMemCounts(name)
	}
	cfg := replication.Config{
		Region:   region,
		POP:      name,
		Topology: topo,
		Conn:     c.Connect(t, region),
		Counts:   counts,
		Domains:  c.Domains(),
		Logger:   testLogger(t),
	}
	if tune != nil {
		tune(&cfg)
	}
	rep, stop := runReplicator(t, cfg)
	p := &pop{name: name, region: region, counts: counts, rep: rep, stop: stop}
	return p
}

// runReplicator runs a Replicator of cfg until the test ends (or the returned
// stop, which waits for Run to return), once it consumes its region's stream.
func runReplicator(t testing.TB, cfg replication.Config) (*replication.Replicator, func()) {
	t.Helper()
	rep, err := replication.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rep.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: Run: %v", cfg.POP, err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("%s: Run did not return 10 s after cancel", cfg.POP)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-rep.Ready():
	case err := <-done:
		t.Fatalf("%s: Run returned before it was ready: %v", cfg.POP, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not consuming its stream after 10 s", cfg.POP)
	}
	return rep, stop
}

// testLogger returns a logger that writes to the test's log until the test
// and its cleanups are over, and then nowhere.
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.close) // registered before the replicator's: runs after it
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// newRand returns a seeded random source, logging the seed so a failure
// replays with -seed.
func newRand(t testing.TB) *rand.Rand {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -seed=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed))
}

// addRandom makes n random adds spread over the pops and keys k0…k(keys-1),
// recording them in the oracles (any may be nil).
func addRandom(r *rand.Rand, pops []*pop, keys, n int, oracles ...*crdttest.Oracle) {
	for range n {
		p := pops[r.IntN(len(pops))]
		key := "k" + strconv.Itoa(r.IntN(keys))
		hits := 1 + r.Uint64N(5)
		p.counts.Add(key, w0, hits)
		for _, o := range oracles {
			if o != nil {
				o.Add(key, w0, hits)
			}
		}
	}
}

// converged returns nil when every pop's state totals exactly what the
// oracle counted, and otherwise the first difference.
func converged(o *crdttest.Oracle, pops ...*pop) error {
	for _, p := range pops {
		if err := o.Check(p.counts.State()); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	return nil
}

// waitFor polls cond until it returns nil or timeout passes, and returns how
// long it took and cond's last error.
func waitFor(timeout time.Duration, cond func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return time.Since(start), err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// converge waits until the pops converge to the oracle, failing the test
// after timeout.
func converge(t testing.TB, timeout time.Duration, o *crdttest.Oracle, pops ...*pop) time.Duration {
	t.Helper()
	took, err := waitFor(timeout, func() error { return converged(o, pops...) })
	if err != nil {
		t.Fatalf("not converged after %v: %v", took, err)
	}
	return took
}

// TestWithinRegion: two PoPs of one region see each other's exact counts
// within a flush interval and a little.
func TestWithinRegion(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}})
	pops := []*pop{
		startPoP(t, c, topo, "eu", "fra1", nil, nil),
		startPoP(t, c, topo, "eu", "par1", nil, nil),
	}
	r := newRand(t)
	var o crdttest.Oracle
	for round := range 5 {
		addRandom(r, pops, 50, 500, &o)
		// A flush interval of 100 ms plus a little: 100 to 180 ms measured
		// under the race detector with two such runs sharing two cores.
		took := converge(t, 100*time.Millisecond+300*time.Millisecond, &o, pops...)
		t.Logf("round %d: converged %v after the last add", round, took)
	}
	for _, p := range pops {
		st := p.rep.Stats()
		if st.AppliedBatches == 0 || st.PublishedBatches == 0 || st.DroppedTotal() != 0 || st.PublishFailures != 0 {
			t.Errorf("%s: stats %+v", p.name, st)
		}
		t.Logf("%s: lag p50 %v p99 %v over %d batches", p.name, st.Lag.P50, st.Lag.P99, st.Lag.Count)
	}
}

// startAll starts a cluster of the regions, the first the hub, and one
// replicator per PoP of the topology.
func startAll(t testing.TB, regions []string, topo replication.Topology, tune func(*replication.Config)) (*natstest.Cluster, []*pop) {
	t.Helper()
	c := natstest.StartRegions(t, regions...)
	var pops []*pop
	for _, region := range regions {
		for _, name := range topo.Regions[region] {
			pops = append(pops, startPoP(t, c, topo, region, name, nil, tune))
		}
	}
	return c, pops
}

// TestAcrossRegions: two regions of two PoPs each, adds everywhere; all four
// converge to the exact sums.
func TestAcrossRegions(t *testing.T) {
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}, "us": {"iad1", "sfo1"}})
	_, pops := startAll(t, []string{"eu", "us"}, topo, nil)
	r := newRand(t)
	var o crdttest.Oracle
	for round := range 3 {
		addRandom(r, pops, 40, 1000, &o)
		took := converge(t, 3*time.Second, &o, pops...)
		t.Logf("round %d: converged %v after the last add", round, took)
	}
}

// TestThreeRegions: with three regions, the two leaf regions exchange counts
// through the hub's stream sourcing.
func TestThreeRegions(t *testing.T) {
	topo := topology(map[string][]string{"eu": {"fra1"}, "us": {"iad1"}, "ap": {"sin1"}})
	_, pops := startAll(t, []string{"eu", "us", "ap"}, topo, nil)
	r := newRand(t)
	var o crdttest.Oracle
	addRandom(r, pops, 20, 300, &o)
	took := converge(t, 5*time.Second, &o, pops...)
	t.Logf("converged %v after the last add", took)
}

// TestPartition cuts the link between two regions, keeps counting on both
// sides (each region converges within itself), heals the link and requires
// every PoP to hold the exact sum within 2 s of the heal.
func TestPartition(t *testing.T) {
	cuts := []time.Duration{time.Second}
	if !testing.Short() {
		// Long enough for stream sourcing to notice the stall (every 10 s)
		// and retry into the cut, after which it stays down for 30 s and
		// more after the heal.
		cuts = append(cuts, 12*time.Second)
	}
	for _, cut := range cuts {
		t.Run("cut="+cut.String(), func(t *testing.T) { testPartition(t, cut) })
	}
}

func testPartition(t *testing.T, cut time.Duration) {
	regions := []string{"eu", "us"}
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}, "us": {"iad1", "sfo1"}})
	c, pops := startAll(t, regions, topo, nil)
	byRegion := map[string][]*pop{"eu": pops[:2], "us": pops[2:]}
	r := newRand(t)

	// all records every add; inRegion[r] the adds made in region r.
	var all crdttest.Oracle
	inRegion := map[string]*crdttest.Oracle{"eu": new(crdttest.Oracle), "us": new(crdttest.Oracle)}
	addEverywhere := func(n int) {
		for _, region := range regions {
			addRandom(r, byRegion[region], 30, n, &all, inRegion[region])
		}
	}
	addEverywhere(200)
	converge(t, 3*time.Second, &all, pops...)

	c.Cut()
	cutAt := time.Now()
	for time.Since(cutAt) < cut {
		addEverywhere(100)
		time.Sleep(250 * time.Millisecond)
	}
	// Inside each region the PoPs agree, and the region's own replicas
	// total exactly what the region counted.
	for _, region := range regions {
		in := crdt.OneOf(topo.Regions[region]...)
		pp := byRegion[region]
		took, err := waitFor(2*time.Second, func() error {
			a, b := pp[0].counts.State(), pp[1].counts.State()
			if err := crdttest.Converged(a, b); err != nil {
				return err
			}
			for k := range 30 {
				key := "k" + strconv.Itoa(k)
				if got, want := a.Total(key, w0, in), inRegion[region].Sum(key, w0); got != want {
					return fmt.Errorf("key %s: the region's replicas total %d, the region counted %d", key, got, want)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("region %s did not converge within itself during the cut (%v): %v", region, took, err)
		}
		t.Logf("region %s converged within itself during the cut", region)
	}
	if err := converged(&all, pops...); err == nil {
		t.Fatal("all PoPs hold the exact global sums during the cut: the link was not cut")
	}

	healAt := time.Now()
	c.Heal()
	took, err := waitFor(2*time.Second, func() error { return converged(&all, pops...) })
	if err != nil {
		t.Fatalf("not converged %v after the heal: %v", took, err)
	}
	t.Logf("converged %v after the heal (cut lasted %v)", took, healAt.Sub(cutAt))

	// After the heal, counting goes on and crosses regions again, whether
	// or not stream sourcing has resumed yet.
	for round := range 3 {
		addEverywhere(100)
		took := converge(t, 6*time.Second, &all, pops...)
		t.Logf("after the heal, round %d: converged %v after the last add", round, took)
	}
	for _, p := range pops {
		st := p.rep.Stats()
		t.Logf("%s: applied %d batches, %d snapshots (%d direct), dropped %d", p.name, st.AppliedBatches, st.AppliedSnapshots, st.DirectSnapshots, st.DroppedTotal())
	}
}

// publishRaw publishes data on subject into the region's stream through
// conn, with its own message id, and waits for the acknowledgement.
func publishRaw(t testing.TB, nc *nats.Conn, subject string, data []byte) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, subject, data); err != nil {
		t.Fatalf("publish on %s: %v", subject, err)
	}
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRedelivery: the same batch published twice, and a replicator
// restarted from the start of the stream, never count anything twice.
func TestRedelivery(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1", "ams1"}})
	fra := startPoP(t, c, topo, "eu", "fra1", nil, nil)
	parCounts := newMemCounts("par1")
	var lastSeq atomic.Uint64
	par := startPoP(t, c, topo, "eu", "par1", parCounts, func(cfg *replication.Config) {
		cfg.OnApplied = func(seq uint64) { lastSeq.Store(seq) }
	})
	r := newRand(t)
	var o crdttest.Oracle
	addRandom(r, []*pop{fra, par}, 20, 300, &o)
	converge(t, 2*time.Second, &o, fra, par)

	// ams1's batch, published twice (as a publisher that retried after a
	// lost acknowledgement would, with a new message id).
	batch := &edgelimitpb.DeltaBatch{Replica: "ams1", Region: "eu", Seq: 1, SentUnixNano: time.Now().UnixNano()}
	for k := range 10 {
		key := "k" + strconv.Itoa(k)
		batch.Add([]byte(key), w0, uint64(k+1))
		o.Add(key, w0, uint64(k+1))
	}
	nc := c.Connect(t, "eu")
	before := par.rep.Stats().AppliedBatches
	for range 2 {
		publishRaw(t, nc, replication.DeltaSubject("eu", "ams1"), marshal(t, batch))
	}
	if _, err := waitFor(2*time.Second, func() error {
		if got := par.rep.Stats().AppliedBatches - before; got < 2 {
			return fmt.Errorf("par1 applied %d of the 2 copies", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	converge(t, 2*time.Second, &o, fra, par)

	// Restart par1's replicator on the same store: once from the start of
	// the stream, once from the position it had reached.
	for _, from := range []uint64{0, lastSeq.Load()} {
		par.stop()
		par = startPoP(t, c, topo, "eu", "par1", parCounts, func(cfg *replication.Config) { cfg.StartSeq = from })
		if from == 0 {
			// Wait until it has read the whole stream again.
			if _, err := waitFor(2*time.Second, func() error {
				if st := par.rep.Stats(); st.LastAppliedSeq < lastSeq.Load() {
					return fmt.Errorf("restarted from 0, at seq %d of %d", st.LastAppliedSeq, lastSeq.Load())
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			// fra1's batch, and ams1's two copies, applied once more.
			if st := par.rep.Stats(); st.AppliedBatches < 3 {
				t.Fatalf("restarted from 0 but applied only %d batches again", st.AppliedBatches)
			}
		}
		if err := converged(&o, fra, par); err != nil {
			t.Fatalf("after a restart from seq %d: %v", from, err)
		}
		st := par.rep.Stats()
		t.Logf("restart from seq %d: applied %d batches, %d snapshots again; still exact", from, st.AppliedBatches, st.AppliedSnapshots)
	}
	// And counting goes on after the restarts.
	addRandom(r, []*pop{fra, par}, 20, 100, &o)
	converge(t, 2*time.Second, &o, fra, par)
}

// TestCorruptMessages: garbage, invalid batches, batches from a newer schema,
// mismatched names and unknown subjects are dropped and counted, and
// replication goes on.
func TestCorruptMessages(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}})
	fra := startPoP(t, c, topo, "eu", "fra1", nil, nil)
	par := startPoP(t, c, topo, "eu", "par1", nil, nil)
	nc := c.Connect(t, "eu")

	valid := func() *edgelimitpb.DeltaBatch {
		b := &edgelimitpb.DeltaBatch{Replica: "x1", Region: "eu", Seq: 7}
		b.Add([]byte("evil"), w0, 1_000_000)
		return b
	}
	uneven := valid()
	uneven.Windows[0].Counts = append(uneven.Windows[0].Counts, 5)
	newer := valid()
	newer.RequiredRevision = edgelimitpb.Revision + 1
	noReplica := valid()
	noReplica.Replica = ""
	wrongPoP := valid()
	wrongPoP.Replica = "x2"
	badSnapshot := &edgelimitpb.Snapshot{Replica: "x1", Region: "eu", Replicas: []*edgelimitpb.ReplicaSlots{{Replica: ""}}}

	cases := []struct {
		subject string
		data    []byte
		reason  replication.DropReason
	}{
		{replication.DeltaSubject("eu", "x1"), []byte("\xff\xff\xff garbage \x00\x01"), replication.DropDecode},
		{replication.SnapshotSubject("eu", "x1"), []byte{0x0a, 0xff}, replication.DropDecode}, // truncated
		{replication.DeltaSubject("eu", "x1"), marshal(t, uneven), replication.DropInvalid},
		{replication.DeltaSubject("eu", "x1"), marshal(t, noReplica), replication.DropInvalid},
		{replication.SnapshotSubject("eu", "x1"), marshal(t, badSnapshot), replication.DropInvalid},
		{replication.DeltaSubject("eu", "x1"), marshal(t, newer), replication.DropRevision},
		{replication.DeltaSubject("eu", "x1"), marshal(t, wrongPoP), replication.DropMismatch},
		{"edgelimit.eu.bogus.x1", marshal(t, valid()), replication.DropSubject},
		{"edgelimit.eu.delta", marshal(t, valid()), replication.DropSubject},
		{"edgelimit.eu.delta.x1.extra", marshal(t, valid()), replication.DropSubject},
	}
	var want [replication.NumDropReasons]uint64
	for _, tc := range cases {
		publishRaw(t, nc, tc.subject, tc.data)
		want[tc.reason]++
	}
	for _, p := range []*pop{fra, par} {
		if _, err := waitFor(3*time.Second, func() error {
			if got := p.rep.Stats().Dropped; got != want {
				return fmt.Errorf("dropped %v, want %v", got, want)
			}
			return nil
		}); err != nil {
			t.Errorf("%s: %v", p.name, err)
		}
		st := p.counts.State()
		if n := st.Total("evil", w0, nil); n != 0 {
			t.Errorf("%s: a dropped message was applied: key evil counts %d", p.name, n)
		}
	}
	for r := range replication.NumDropReasons {
		t.Logf("dropped %-8s %d", replication.DropReason(r), want[r])
	}
	// Replication goes on.
	var o crdttest.Oracle
	addRandom(newRand(t), []*pop{fra, par}, 10, 100, &o)
	converge(t, 2*time.Second, &o, fra, par)
}

// benchKeys returns n distinct 30-byte keys, in sorted order.
func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("api_key=%022d", i)
	}
	return keys
}

// BenchmarkReplication measures replication between two PoPs of one region
// on loopback (one embedded server; the server, both PoPs and the load all
// share this process), with the default 100 ms flush interval and 5 s
// snapshots.
//
// throughput/keys=N: once per flush interval, fra1 adds a hit to each of N
// distinct keys, so every flush carries N slot updates; at the end the
// benchmark waits until par1 holds the final counts. slots/s is the slot
// updates par1 applied per second, from the first add to the last apply
// (N×10/s when replication keeps up);
// wireB/slot the payload bytes fra1 published per slot (NATS and JetStream
// headers not included: about 100 bytes per message of up to 1 MiB);
// lag-p50/p99 the batch lag (the sender's clock when it built a batch to the
// receiver's clock when it applied it, not counting the wait for the flush).
//
// visibility/load=N: the same load of N keys per flush, and a probe key that
// fra1 counts at random instants; visible-p50/p99 is the time from the add
// to par1 holding it, the wait for the flush included.
func BenchmarkReplication(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 250_000} {
		b.Run(fmt.Sprintf("throughput/keys=%d", n), func(b *testing.B) { benchThroughput(b, n) })
	}
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("visibility/load=%d", n), func(b *testing.B) { benchVisibility(b, n) })
	}
}

// benchPoPs starts a region with PoPs fra1 and par1, par1's store reporting
// every Apply to applied.
func benchPoPs(b *testing.B, applied func([]crdt.Slot)) (fra, par *pop) {
	c := natstest.StartRegions(b, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}})
	quiet := func(cfg *replication.Config) { cfg.Logger = slog.New(slog.DiscardHandler) }
	parCounts := newMemCounts("par1")
	parCounts.applied = applied
	fra = startPoP(b, c, topo, "eu", "fra1", nil, quiet)
	par = startPoP(b, c, topo, "eu", "par1", parCounts, quiet)
	return fra, par
}

// load adds a hit to each key once per flush interval until stop is closed.
func load(fra *pop, keys []string, stop <-chan struct{}) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			for _, k := range keys {
				fra.counts.Add(k, w0, 1)
			}
		}
	}
}

func benchThroughput(b *testing.B, n int) {
	keys := benchKeys(n)
	last := keys[n-1]
	// Batches apply in stream order, and a flush carries its slots in key
	// order, so par1 holds round r everywhere once the last key reaches r.
	var reached atomic.Uint64
	fra, par := benchPoPs(b, func(slots []crdt.Slot) {
		for _, s := range slots {
			if s.Key == last && s.Replica == "fra1" && s.Count > reached.Load() {
				reached.Store(s.Count)
			}
		}
	})
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	before, pubBefore := par.rep.Stats(), fra.rep.Stats()
	var start time.Time // the first add
	round := uint64(0)
	for b.Loop() {
		<-tick.C
		if round++; round == 1 {
			start = time.Now()
		}
		for _, k := range keys {
			fra.counts.Add(k, w0, 1)
		}
	}
	for reached.Load() < round {
		time.Sleep(200 * time.Microsecond)
	}
	elapsed := time.Since(start)
	after, pubAfter := par.rep.Stats(), fra.rep.Stats()
	b.ReportMetric(float64(after.AppliedSlots-before.AppliedSlots)/elapsed.Seconds(), "slots/s")
	if ps := pubAfter.PublishedSlots - pubBefore.PublishedSlots; ps > 0 {
		b.ReportMetric(float64(pubAfter.PublishedBytes-pubBefore.PublishedBytes)/float64(ps), "wireB/slot")
	}
	b.ReportMetric(float64(after.Lag.P50)/1e6, "lag-p50-ms")
	b.ReportMetric(float64(after.Lag.P99)/1e6, "lag-p99-ms")
	if err := converged(oracleOf(keys, round), fra, par); err != nil {
		b.Fatal(err)
	}
}

// oracleOf is the oracle of `rounds` hits on each key.
func oracleOf(keys []string, rounds uint64) *crdttest.Oracle {
	var o crdttest.Oracle
	for _, k := range keys {
		o.Add(k, w0, rounds)
	}
	return &o
}

func benchVisibility(b *testing.B, n int) {
	const probe = "probe"
	seen := make(chan uint64, 1024)
	fra, _ := benchPoPs(b, func(slots []crdt.Slot) {
		for _, s := range slots {
			if s.Key == probe && s.Replica == "fra1" {
				seen <- s.Count
			}
		}
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		load(fra, benchKeys(n), stop)
	}()
	defer func() { close(stop); wg.Wait() }()

	r := rand.New(rand.NewPCG(7, 7))
	var lags []time.Duration
	count := uint64(0)
	for b.Loop() {
		time.Sleep(time.Duration(r.Int64N(int64(100 * time.Millisecond)))) // a random phase of the flush
		count++
		added := time.Now()
		fra.counts.Add(probe, w0, 1)
		for got := <-seen; got < count; got = <-seen {
		}
		lags = append(lags, time.Since(added))
	}
	slices.Sort(lags)
	q := func(p float64) float64 { return float64(lags[int(p*float64(len(lags)-1))]) / 1e6 }
	b.ReportMetric(q(0.50), "visible-p50-ms")
	b.ReportMetric(q(0.99), "visible-p99-ms")
}

// TestRunStops: Run returns soon after its context is done, leaves no
// goroutine behind, refuses to run twice, and New rejects bad configs.
func TestRunStops(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	nc := c.Connect(t, "eu")
	counts := newMemCounts("fra1")
	cfg := replication.Config{Region: "eu", POP: "fra1", Conn: nc, Counts: counts, Logger: testLogger(t)}
	for name, bad := range map[string]func(*replication.Config){
		"no region":          func(c *replication.Config) { c.Region = "" },
		"dotted PoP":         func(c *replication.Config) { c.POP = "fra.1" },
		"no conn":            func(c *replication.Config) { c.Conn = nil },
		"no counts":          func(c *replication.Config) { c.Counts = nil },
		"region not in topo": func(c *replication.Config) { c.Topology = topology(map[string][]string{"us": {"iad1"}}) },
		"negative flush":     func(c *replication.Config) { c.FlushInterval = -time.Second },
		"clashing streams":   func(c *replication.Config) { c.Topology = topology(map[string][]string{"eu": nil, "EU": nil}) },
	} {
		bc := cfg
		bad(&bc)
		if _, err := replication.New(bc); err == nil {
			t.Errorf("%s: New accepted the config", name)
		}
	}

	// The connection's shared request-reply subscription stays for the
	// connection's life once any request made it; make it before counting.
	if _, err := nc.Request("edgelimit-test.warm-up", nil, 10*time.Millisecond); err != nil && !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) {
		t.Fatal(err)
	}
	before := clientGoroutines()
	rep, err := replication.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rep.Run(ctx) }()
	<-rep.Ready()
	if err := rep.Run(ctx); !errors.Is(err, replication.ErrRunning) {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}
	counts.Add("k", w0, 1)
	time.Sleep(150 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if st := rep.Stats(); st.PublishedSlots != 1 {
		t.Errorf("published %d slots, want 1", st.PublishedSlots)
	}
	if _, err := waitFor(2*time.Second, func() error {
		if n := clientGoroutines(); n > before {
			return fmt.Errorf("%d goroutines of replication and the NATS client, %d before Run", n, before)
		}
		return nil
	}); err != nil {
		buf := make([]byte, 1<<20)
		t.Fatalf("%v\n%s", err, buf[:runtime.Stack(buf, true)])
	}
}

// clientGoroutines counts the goroutines running code of package replication
// or of the NATS client; the embedded server's own goroutines (its stream and
// the ephemeral consumer, which outlive Run until the server drops them) do
// not count.
func clientGoroutines() int {
	buf := make([]byte, 4<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "nats-server") {
			continue
		}
		if strings.Contains(g, "edgelimit/replication.") || strings.Contains(g, "nats-io/nats.go") {
			n++
		}
	}
	return n
}

func TestConnect(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	nc, err := replication.Connect(replication.ConnConfig{URL: c.URL("eu"), Name: "fra1", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.FlushTimeout(2 * time.Second); err != nil || !nc.IsConnected() {
		t.Fatalf("not connected: %v", err)
	}

	// Nothing listens: Connect still returns, the connection keeps trying.
	down, err := replication.Connect(replication.ConnConfig{URL: "nats://127.0.0.1:1", Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("Connect with no server: %v", err)
	}
	if down.IsConnected() {
		t.Error("connected to nothing")
	}
	down.Close()

	for name, cfg := range map[string]replication.ConnConfig{
		"no URL":            {},
		"two credentials":   {URL: c.URL("eu"), User: "u", Password: "p", Token: "t"},
		"missing nkey seed": {URL: c.URL("eu"), NKeySeedFile: t.TempDir() + "/missing.nk"},
		"cert without key":  {URL: c.URL("eu"), CertFile: "cert.pem"},
	} {
		if nc, err := replication.Connect(cfg); err == nil {
			nc.Close()
			t.Errorf("%s: Connect accepted the config", name)
		}
	}
}

// TestPublishRetry cuts a PoP off its NATS server while it counts: its
// publishes fail or go unacknowledged, their slots are kept and published
// again, and once it is back both PoPs hold the exact counts.
func TestPublishRetry(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}})
	proxy, url := c.ClientProxy(t, "eu")
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	fra := startPoP(t, c, topo, "eu", "fra1", nil, func(cfg *replication.Config) {
		cfg.Conn = nc
		cfg.AckTimeout = 200 * time.Millisecond
	})
	par := startPoP(t, c, topo, "eu", "par1", nil, nil)
	r := newRand(t)
	var o crdttest.Oracle
	addRandom(r, []*pop{fra, par}, 20, 200, &o)
	converge(t, 2*time.Second, &o, fra, par)

	proxy.Cut()
	for range 6 {
		addRandom(r, []*pop{fra, par}, 20, 100, &o)
		time.Sleep(200 * time.Millisecond)
	}
	if st := fra.rep.Stats(); st.PublishFailures == 0 || st.RetrySlots == 0 {
		t.Errorf("cut off NATS, fra1 saw no failed publish: %+v", st)
	}
	proxy.Heal()
	took := converge(t, 3*time.Second, &o, fra, par)
	st := fra.rep.Stats()
	t.Logf("converged %v after fra1 got its server back; %d publishes failed and were retried", took, st.PublishFailures)
}
