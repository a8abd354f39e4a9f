package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
	"github.com/edgelimit/edgelimit/replication"
)

var _ replication.Counts = (*Redis)(nil)

// The Redis store's replication, held to the cases of replicated_test.go.
// Each PoP has its own Redis database (db 1, 2, 3 of one server, so the
// suite starts one server per test); stores of one PoP share one.

// replClock is the clock of a test's stores: ClockLocal, and the Clock that
// Apply, Restore and the TTLs read, set to the test's instants.
type replClock struct{ atomic.Int64 }

func (c *replClock) at(now int64) int64 { c.Store(now); return now }

func openReplRedis(t *testing.T, url, replica string, clock *replClock, peers ...string) *Redis {
	t.Helper()
	return openTestRedis(t, url, RedisConfig{ClockSource: ClockLocal, Clock: clock.Load,
		Replica: replica, RegionPeers: peers})
}

// exchangeRedis delivers every store's delta to every other store.
func exchangeRedis(t *testing.T, stores ...*Redis) {
	t.Helper()
	for i, from := range stores {
		d, err := from.DeltaCtx(context.Background())
		if err != nil {
			t.Fatalf("Delta: %v", err)
		}
		for j, to := range stores {
			if i != j {
				if err := to.ApplyCtx(context.Background(), d); err != nil {
					t.Fatalf("Apply: %v", err)
				}
			}
		}
	}
}

func dbURL(srv *redistest.Server, db int) string { return fmt.Sprintf("%s/%d", srv.URL(), db) }

func TestRedisReplicatedScopes(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.Add(10 * time.Second).UnixNano())
	// Region eu: a, b. Region us: c.
	a := openReplRedis(t, dbURL(srv, 1), "a", clock, "b")
	b := openReplRedis(t, dbURL(srv, 2), "b", clock, "a")
	c := openReplRedis(t, dbURL(srv, 3), "c", clock)
	testReplicatedScopes(t, now, a, b, c)
}

// On a Cluster the merge calls are grouped per slot; a is a Cluster PoP.
func TestRedisReplicatedScopesCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	nodes := redistest.StartCluster(t, 3)
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.Add(10 * time.Second).UnixNano())
	a := openReplRedis(t, nodes[0].Addr+","+nodes[1].Addr+","+nodes[2].Addr, "a", clock, "b")
	b := openReplRedis(t, dbURL(srv, 2), "b", clock, "a")
	c := openReplRedis(t, dbURL(srv, 3), "c", clock)
	testReplicatedScopes(t, now, a, b, c)
}

func testReplicatedScopes(t *testing.T, now int64, a, b, c *Redis) {
	t.Helper()
	global := replItem("g", 10, limit.ScopeGlobal)
	region := replItem("r", 10, limit.ScopeRegion)
	local := replItem("p", 10, limit.ScopePOP)

	if got := admit(t, a, now, global, 6) + admit(t, c, now, global, 2); got != 8 {
		t.Fatalf("admitted %d before any exchange", got)
	}
	exchangeRedis(t, a, b, c)
	// Every PoP now knows 8 of 10 are spent: only 2 more anywhere.
	if got := admit(t, b, now, global, 5); got != 2 {
		t.Fatalf("b admitted %d of the 2 left of the global limit", got)
	}
	exchangeRedis(t, a, b, c)
	if got := admit(t, a, now, global, 1) + admit(t, c, now, global, 1); got != 0 {
		t.Fatalf("global limit spent, yet %d admitted", got)
	}

	// Region scope: c's hits are in another region and do not count for eu.
	admit(t, a, now, region, 7)
	admit(t, c, now, region, 10)
	exchangeRedis(t, a, b, c)
	if got := admit(t, b, now, region, 5); got != 3 {
		t.Fatalf("b admitted %d of eu's 3 left", got)
	}

	// Pop scope is never replicated.
	admit(t, a, now, local, 10)
	exchangeRedis(t, a, b, c)
	if got := admit(t, b, now, local, 10); got != 10 {
		t.Fatalf("pop scope leaked across PoPs: b admitted %d", got)
	}
	own := a.Own()
	if len(own) != 2 { // g and r, in the current window
		t.Fatalf("a's own slots %v, want g and r", own)
	}
	for _, sl := range own {
		if sl.Replica != "a" {
			t.Fatalf("own slot of replica %q", sl.Replica)
		}
	}
	if err := a.ReplicationErr(); err != nil {
		t.Fatal(err)
	}
	// b merged g from a (6) and c (2, then 0 more) and r from a (7) and c (10).
	var remote []string
	for _, sl := range b.Remote() {
		remote = append(remote, fmt.Sprintf("%s=%d", sl.Replica, sl.Count))
	}
	slices.Sort(remote)
	if want := []string{"a=6", "a=7", "c=10", "c=2"}; !slices.Equal(remote, want) {
		t.Fatalf("b's remote slots %v, want %v", remote, want)
	}
}

// The previous window counts with its sliding weight, remote hits included.
func TestRedisReplicatedSlidingWindow(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	a := openReplRedis(t, dbURL(srv, 1), "a", clock)
	b := openReplRedis(t, dbURL(srv, 2), "b", clock)
	it := replItem("w", 100, limit.ScopeGlobal)
	t0 := limittest.T0.UnixNano()
	admit(t, a, clock.at(t0+int64(10*time.Second)), it, 40)
	admit(t, b, clock.at(t0+int64(20*time.Second)), it, 40)
	exchangeRedis(t, a, b)
	// 45 s into the next minute: 80 × 0.25 = 20 spent; 80 fit.
	if got := admit(t, a, clock.at(t0+int64(105*time.Second)), it, 100); got != 80 {
		t.Fatalf("admitted %d, want 80", got)
	}
	// Two minutes on, b's own first minute no longer counts, and a's second
	// minute, all remote to b, weighs 0.5: 40 spent, 60 fit.
	exchangeRedis(t, a, b)
	if got := admit(t, b, clock.at(t0+int64(150*time.Second)), it, 100); got != 60 {
		t.Fatalf("admitted %d, want 60", got)
	}
}

// A restarted PoP whose Redis was emptied counts what it restored, and never
// publishes less.
func TestRedisReplicatedRestore(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.UnixNano())
	url := dbURL(srv, 1)
	a := openReplRedis(t, url, "a", clock)
	it := replItem("x", 10, limit.ScopeGlobal)
	admit(t, a, now, it, 7)
	saved := a.Delta()
	if len(saved) != 1 || saved[0].Count != 7 {
		t.Fatalf("delta %v, want one slot of 7", saved)
	}
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	restarted := openReplRedis(t, url, "a", clock)
	if err := restarted.RestoreCtx(context.Background(), saved); err != nil {
		t.Fatal(err)
	}
	// Restore is a max: a lower or repeated value changes nothing.
	lower := slices.Clone(saved)
	lower[0].Count = 2
	if err := restarted.RestoreCtx(context.Background(), append(lower, saved...)); err != nil {
		t.Fatal(err)
	}
	if got := admit(t, restarted, now, it, 10); got != 3 {
		t.Fatalf("restarted store admitted %d, want the 3 left", got)
	}
	d := restarted.Delta()
	if len(d) != 1 || d[0].Count != 10 {
		t.Fatalf("published %v, want the PoP's 10", d)
	}
	// A restored previous window weighs in the next one.
	t1 := clock.at(limittest.T0.Add(90 * time.Second).UnixNano()) // 30 s into the next minute
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	if err := restarted.RestoreCtx(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	if got := admit(t, restarted, t1, it, 10); got != 5 { // 10 × 0.5 spent
		t.Fatalf("admitted %d after restoring the previous window, want 5", got)
	}
}

// Apply is a per-replica max: duplicated, reordered and stale deliveries
// never count twice, and this PoP's own slots are ignored.
func TestRedisReplicatedApplyIdempotent(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.Add(5 * time.Second).UnixNano())
	it := replItem("i", 20, limit.ScopeGlobal)
	key := string(it.Key)
	w0 := limit.WindowStart(now, int64(time.Minute))
	slot := func(rep string, n uint64) crdt.Slot {
		return crdt.Slot{Key: key, Window: w0, Replica: rep, Count: n}
	}
	batches := [][]crdt.Slot{
		{slot("b", 3), slot("c", 1)},
		{slot("b", 5)},
		{slot("b", 3), slot("c", 2), slot("b", 5)}, // stale and duplicated
		{slot("a", 100)},                           // a's own: ignored
		{slot("c", 2)},
	}
	for _, order := range [][]int{{0, 1, 2, 3, 4}, {4, 2, 1, 0, 3, 2, 1}} {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			if _, err := srv.Do("FLUSHALL"); err != nil {
				t.Fatal(err)
			}
			a := openReplRedis(t, dbURL(srv, 0), "a", clock) // db 0: srv.Do reads it
			for _, i := range order {
				if err := a.ApplyCtx(context.Background(), batches[i]); err != nil {
					t.Fatal(err)
				}
			}
			// b 5 + c 2 = 7 of 20 spent.
			if got := admit(t, a, now, it, 20); got != 13 {
				t.Fatalf("admitted %d, want 13", got)
			}
			got := a.Remote()
			want := []crdt.Slot{slot("b", 5), slot("c", 2)}
			if !slices.Equal(got, want) {
				t.Fatalf("remote %v, want %v", got, want)
			}
			ttl, err := srv.Do("PTTL", string(appendRemoteKey(nil, it.Key, w0/int64(time.Minute))))
			if err != nil || ttl == "-1" || ttl == "-2" {
				t.Fatalf("remote hash TTL %q (%v), want one", ttl, err)
			}
		})
	}
}

// Servers of one PoP share its Redis and are one replica: each publishes the
// PoP's absolute count of what it counted, and a receiver counts it once.
func TestRedisReplicatedServersOfOnePoP(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.UnixNano())
	a1 := openReplRedis(t, dbURL(srv, 1), "a", clock)
	a2 := openReplRedis(t, dbURL(srv, 1), "a", clock)
	b := openReplRedis(t, dbURL(srv, 2), "b", clock)
	it := replItem("s", 10, limit.ScopeGlobal)
	admit(t, a1, now, it, 3)
	admit(t, a2, now, it, 4)
	d1, d2 := a1.Delta(), a2.Delta()
	if len(d1) != 1 || len(d2) != 1 || d1[0].Count != 7 || d2[0].Count != 7 {
		t.Fatalf("deltas %v and %v, want the PoP's 7 from each", d1, d2)
	}
	if d := a1.Delta(); d != nil {
		t.Fatalf("second delta %v, want nothing", d)
	}
	b.Apply(0, d1)
	b.Apply(0, d2)
	if err := b.ReplicationErr(); err != nil {
		t.Fatal(err)
	}
	if got := admit(t, b, now, it, 10); got != 3 {
		t.Fatalf("b admitted %d, want 3", got)
	}
}

// Apply drops slots for windows older than the previous one, and slots whose
// key is not a window limit's store key.
func TestRedisReplicatedApplyIgnores(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.Add(3 * time.Minute).UnixNano())
	a := openReplRedis(t, dbURL(srv, 0), "a", clock) // db 0: srv.Do reads it
	it := replItem("o", 10, limit.ScopeGlobal)
	old := limittest.T0.UnixNano() // three windows back
	if err := a.ApplyCtx(context.Background(), []crdt.Slot{
		{Key: string(it.Key), Window: old, Replica: "b", Count: 5},
		{Key: "not a store key", Window: now, Replica: "b", Count: 5},
	}); err != nil {
		t.Fatal(err)
	}
	// The PoP marker (redis_owner.go), the lease marker (redis_leases.go)
	// and the servers set (redis_servers.go) alone.
	if n, err := srv.Do("DBSIZE"); err != nil || n != "3" {
		t.Fatalf("DBSIZE %q (%v) after applying nothing live, want 3: the PoP and lease markers and the servers set", n, err)
	}
}

// globalScope checks every item with scope global: on a replicating store
// with no remote counts, the table's decisions must not change.
type globalScope struct{ s *Redis }

func (g globalScope) CheckAt(ctx context.Context, now, hits int64, items []limit.Item, out []limit.Decision) error {
	items = slices.Clone(items)
	for i := range items {
		items[i].Scope = limit.ScopeGlobal
	}
	return g.s.CheckAt(ctx, now, hits, items, out)
}

func TestRedisReplicatedTable(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Replica: "a", RegionPeers: []string{"b"}})
	limittest.Run(t, func(*testing.T) limittest.Store { return globalScope{s} })
}

// Tracked pairs of windows older than the previous one are dropped; a store
// without a replica name replicates nothing; failures reach ReplicationErr.
func TestRedisReplicatedBounds(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	t0 := clock.at(limittest.T0.UnixNano())
	a := openReplRedis(t, dbURL(srv, 1), "a", clock)
	b := openReplRedis(t, dbURL(srv, 2), "b", clock)
	it := replItem("t", 10, limit.ScopeGlobal)
	admit(t, a, t0, it, 2)
	exchangeRedis(t, a, b)
	if len(a.Own()) != 1 || len(b.Remote()) != 1 {
		t.Fatalf("own %v remote %v, want one slot each", a.Own(), b.Remote())
	}
	clock.at(t0 + int64(2*time.Minute)) // the first minute is no longer held
	if own, remote := a.Own(), b.Remote(); len(own) != 0 || len(remote) != 0 {
		t.Fatalf("windows older than the previous one survived: own %v remote %v", own, remote)
	}
	a.rep.mu.Lock()
	n := len(a.rep.own)
	a.rep.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d own pairs still tracked", n)
	}

	plain := openTestRedis(t, dbURL(srv, 3), RedisConfig{ClockSource: ClockLocal})
	plain.Restore([]crdt.Slot{{Key: string(it.Key), Window: t0, Replica: "a", Count: 1}})
	plain.Apply(0, []crdt.Slot{{Key: string(it.Key), Window: t0, Replica: "b", Count: 1}})
	if plain.Delta() != nil || plain.Own() != nil || plain.Remote() != nil || plain.ReplicationErr() != nil {
		t.Fatal("a store without a replica name replicated")
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b.Apply(0, []crdt.Slot{{Key: string(it.Key), Window: t0 + int64(2*time.Minute), Replica: "a", Count: 3}})
	if err := b.ReplicationErr(); err == nil || !strings.Contains(err.Error(), "applying 1 remote slots") {
		t.Fatalf("ReplicationErr %v after applying to a closed store", err)
	}
}
