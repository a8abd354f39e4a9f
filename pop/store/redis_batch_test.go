package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// Tests of the packing of many checks into one script run (evalGroup).

// batchCheck is one check of a hand-built batch.
type batchCheck struct {
	now, hits int64
	items     []limit.Item
}

// runDirect runs checks as one batch of s, in their order, as a pipeliner
// would, and returns each check's decisions and error.
func runDirect(t *testing.T, s *Redis, checks []batchCheck) ([][]limit.Decision, []error) {
	t.Helper()
	return runDirectBy(t, s, checks, time.Now().Add(testTimeout))
}

// runDirectBy is runDirect with every check's deadline at deadline.
func runDirectBy(t *testing.T, s *Redis, checks []batchCheck, deadline time.Time) ([][]limit.Decision, []error) {
	t.Helper()
	batch := make([]*request, len(checks))
	for i, c := range checks {
		r := s.reqs.Get().(*request)
		r.prepare(s, c.now, c.hits, c.items, nil, deadline)
		batch[i] = r
	}
	var sc scratch
	s.runBatch(slices.Clone(batch), &sc)
	outs := make([][]limit.Decision, len(checks))
	errs := make([]error, len(checks))
	for i, r := range batch {
		<-r.done
		outs[i], errs[i] = slices.Clone(r.res), r.err
		s.reqs.Put(r)
	}
	return outs, errs
}

var evalshaCalls = regexp.MustCompile(`cmdstat_evalsha:calls=(\d+)`)

// scriptRuns is how many EVALSHAs srv has run.
func scriptRuns(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	m := evalshaCalls.FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// Many goroutines, more than the stores' pipelines, over two store clients
// hammer a few keys of each algorithm with one- and two-item checks: every
// key admits exactly its limit, and the checks really shared script runs.
func TestRedisBatchConcurrentExact(t *testing.T) {
	srv := redistest.Start(t)
	cfg := RedisConfig{ClockSource: ClockLocal, Pipelines: 2, BatchWindow: time.Millisecond}
	stores := []*Redis{openTestRedis(t, srv.URL(), cfg), openTestRedis(t, srv.URL(), cfg)}
	run := time.Now().UnixNano()
	now := limittest.T0.UnixNano()
	const limitN, keys, goroutines, perG = 40, 4, 24, 40
	var checks atomic.Int64
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			spec := limit.Spec{Algorithm: alg, Limit: limitN, Window: int64(time.Hour)}
			var pool []limit.Item
			for k := range keys {
				pool = append(pool, limit.Item{Key: fmt.Appendf(nil, "batch:%d:%s:%d", run, alg, k), Spec: spec})
			}
			admitted := make([]atomic.Int64, keys)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := stores[g%len(stores)]
					rng := rand.New(rand.NewPCG(uint64(g), uint64(alg)))
					out := make([]limit.Decision, 2)
					for range perG {
						ks := []int{rng.IntN(keys)}
						if rng.IntN(4) == 0 { // a second, different key
							ks = append(ks, (ks[0]+1+rng.IntN(keys-1))%keys)
						}
						items := make([]limit.Item, len(ks))
						for i, k := range ks {
							items[i] = pool[k]
						}
						checks.Add(1)
						if err := s.CheckAt(context.Background(), now, 1, items, out); err != nil {
							t.Error(err)
							return
						}
						if limit.Admit(items, out) {
							for _, k := range ks {
								admitted[k].Add(1)
							}
						}
					}
				}()
			}
			wg.Wait()
			for k := range admitted {
				if got := admitted[k].Load(); got != limitN {
					t.Errorf("key %d admitted %d, want its limit %d", k, got, limitN)
				}
			}
		})
	}
	runs := scriptRuns(t, srv)
	t.Logf("%d checks in %d script runs", checks.Load(), runs)
	if runs == 0 || int64(runs) >= checks.Load() {
		t.Fatalf("%d checks took %d script runs: no run carried more than one check", checks.Load(), runs)
	}
}

// randomChecks returns n checks over a few keys of every algorithm, with
// varying now (mostly forward, sometimes a little back: a lagging server),
// hits, shadow items, scopes and item counts. Keys drawn from multi are used
// by at most one check of each chunk of chunk checks (and again in later
// chunks), and only by checks of
// two or more items (Cluster: a check spanning slots peeks and decides in
// two phases, so in a batch it must not share keys with the others to match
// running the checks one by one).
func randomChecks(seed uint64, prefix string, n, chunk int) []batchCheck {
	rng := rand.New(rand.NewPCG(seed, 7))
	minute := int64(time.Minute)
	specs := []limit.Spec{
		{Algorithm: limit.SlidingWindow, Limit: 6, Window: minute},
		{Algorithm: limit.FixedWindow, Limit: 5, Window: 10 * int64(time.Second)},
		{Algorithm: limit.TokenBucket, Limit: 4, Window: minute, Burst: 3},
		{Algorithm: limit.GCRA, Limit: 6, Window: minute, Burst: 2},
		{Algorithm: limit.SlidingLog, Limit: 4, Window: 20 * int64(time.Second)},
	}
	item := func(kind string, k int) limit.Item {
		sp := specs[k%len(specs)]
		it := limit.Item{Key: fmt.Appendf(nil, "%s:%s:%d", prefix, kind, k), Spec: sp}
		if sp.Algorithm.Replicable() {
			it.Scope = limit.Scope(k / len(specs) % 3) // pop, region, global
		}
		return it
	}
	now := limittest.T0.UnixNano() + int64(7*time.Second)
	var checks []batchCheck
	var multiNext int
	for i := 0; i < n; i++ {
		if i%chunk == 0 {
			multiNext = 0
		}
		now += rng.Int64N(int64(3 * time.Second))
		at := now
		if rng.IntN(8) == 0 {
			at -= rng.Int64N(int64(2 * time.Second))
		}
		c := batchCheck{now: at, hits: 1 + rng.Int64N(2)}
		switch rng.IntN(4) {
		case 0: // several items, keys of the multi pool, fresh in this chunk
			for range 2 + rng.IntN(2) {
				c.items = append(c.items, item("m", multiNext))
				multiNext++
			}
		default:
			for range 1 + rng.IntN(2) {
				c.items = append(c.items, item("s", rng.IntN(3*len(specs))))
			}
			if len(c.items) == 2 && c.items[0].Spec.Algorithm.Replicable() && rng.IntN(3) == 0 {
				c.items[1] = c.items[0] // one key twice: one shared state
			}
		}
		for j := range c.items {
			c.items[j].Shadow = rng.IntN(6) == 0
		}
		checks = append(checks, c)
	}
	return checks
}

// seedRemote writes remote totals for the replicated items of checks into
// s's Redis, for every window their checks fall in and the one before, so
// that the remote keys check.lua reads carry values.
func seedRemote(t *testing.T, s *Redis, checks []batchCheck) {
	t.Helper()
	ctx := context.Background()
	seen := map[string]bool{}
	for _, c := range checks {
		for _, it := range c.items {
			if !s.replicates(&it) {
				continue
			}
			idx := limit.WindowStart(c.now, it.Spec.Window) / it.Spec.Window
			for _, w := range []int64{idx, idx - 1} {
				key := string(appendRemoteKey(nil, it.Key, w))
				if seen[key] {
					continue
				}
				seen[key] = true
				if err := s.client.HSet(ctx, key, "~g", 1+w%2, "~r", 1).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// oneByOne runs checks one at a time on s, each its own script run.
func oneByOne(t *testing.T, s *Redis, checks []batchCheck) [][]limit.Decision {
	t.Helper()
	outs := make([][]limit.Decision, len(checks))
	for i, c := range checks {
		outs[i] = make([]limit.Decision, len(c.items))
		if err := s.CheckAt(context.Background(), c.now, c.hits, c.items, outs[i]); err != nil {
			t.Fatalf("check %d alone: %v", i, err)
		}
	}
	return outs
}

// compareBatched runs checks in batches of chunk on batched and one by one on
// single, and requires the same decisions. It also requires both some
// admitted and some denied items, so that the comparison means something.
func compareBatched(t *testing.T, batched, single *Redis, checks []batchCheck, chunk int, between func(i int)) {
	t.Helper()
	want := oneByOne(t, single, checks)
	var allowed, denied int
	for start := 0; start < len(checks); start += chunk {
		if between != nil {
			between(start / chunk)
		}
		part := checks[start:min(start+chunk, len(checks))]
		outs, errs := runDirect(t, batched, part)
		for i := range part {
			if errs[i] != nil {
				t.Fatalf("check %d in a batch: %v", start+i, errs[i])
			}
			for j, d := range outs[i] {
				if d != want[start+i][j] {
					t.Fatalf("check %d (now %d, hits %d) item %d (%s %s): batched %+v, alone %+v",
						start+i, part[i].now, part[i].hits, j, part[i].items[j].Key, part[i].items[j].Spec.Algorithm, d, want[start+i][j])
				}
				if d.Allowed {
					allowed++
				} else {
					denied++
				}
			}
		}
	}
	if allowed == 0 || denied == 0 {
		t.Fatalf("%d items allowed, %d denied: the checks do not exercise both", allowed, denied)
	}
}

// A batch mixing checks with different now, hits, algorithms, shadow items,
// replicated items (with remote totals) and repeated keys decides each check
// as running them one by one does, however many calls a script run carries;
// also when the script cache was flushed between batches (EVAL fallback).
// (At 1 item a run every call runs alone, and a call of more items too.)
func TestRedisBatchMatchesOneByOne(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	// Without the cache of keys over their limit: see
	// TestRedisClusterBatchMatchesOneByOne.
	cfg := RedisConfig{ClockSource: ClockLocal, Replica: "p1", RegionPeers: []string{"p2"}, DenyCacheKeys: -1}
	batched, single := openTestRedis(t, a.URL(), cfg), openTestRedis(t, b.URL(), cfg)
	for _, perRun := range []int{1, 3, maxEvalItems} {
		t.Run(fmt.Sprintf("items-per-run-%d", perRun), func(t *testing.T) {
			batched.evalItems = perRun
			const chunk = 40
			checks := randomChecks(uint64(perRun), fmt.Sprintf("same:%d:%d", time.Now().UnixNano(), perRun), 240, chunk)
			seedRemote(t, batched, checks)
			seedRemote(t, single, checks)
			before := scriptRuns(t, a)
			compareBatched(t, batched, single, checks, chunk, func(i int) {
				if i == 2 {
					if _, err := a.Do("SCRIPT", "FLUSH"); err != nil {
						t.Fatal(err)
					}
				}
			})
			// Runs answered NOSCRIPT count too: one batch's.
			if runs := scriptRuns(t, a) - before; perRun > 3 && runs >= len(checks) {
				t.Errorf("%d script runs for %d checks at up to %d items a run: calls were not packed", runs, len(checks), perRun)
			}
		})
	}
	batched.evalItems = maxEvalItems
}

// In a Cluster, calls on one slot share a script run and calls on others go
// to their own nodes; checks spanning slots peek, then decide, in the same
// batch. The decisions are those of running the checks one by one.
func TestRedisClusterBatchMatchesOneByOne(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	single := redistest.Start(t)
	// Without the cache of keys over their limit: it answers a different
	// subset of the checks in each store, so the Redis state of a token
	// bucket is refilled at other instants, and its floats round apart.
	cfg := RedisConfig{ClockSource: ClockLocal, Replica: "p1", DenyCacheKeys: -1}
	batched := openTestRedis(t, nodes[0].Addr+","+nodes[1].Addr+","+nodes[2].Addr, cfg)
	one := openTestRedis(t, single.URL(), cfg)
	run := time.Now().UnixNano()
	const chunk = 30
	checks := randomChecks(11, fmt.Sprintf("cl:%d", run), 180, chunk)
	// Only the multi pool's keys may be checked by a check spanning slots.
	for i, c := range checks {
		if !strings.Contains(string(c.items[0].Key), ":m:") && len(c.items) > 1 && keySlot(c.items[1].Key) != keySlot(c.items[0].Key) {
			checks[i].items = c.items[:1]
		}
	}
	// Two keys of one slot, checked together and apart: one script call,
	// packed with the other checks of that slot.
	a := fmt.Appendf(nil, "cl:%d:pair:a", run)
	var b []byte
	for i := 0; ; i++ {
		b = fmt.Appendf(nil, "cl:%d:pair:b%d", run, i)
		if keySlot(b) == keySlot(a) {
			break
		}
	}
	fw := limit.Spec{Algorithm: limit.FixedWindow, Limit: 4, Window: int64(time.Minute)}
	tb := limit.Spec{Algorithm: limit.TokenBucket, Limit: 5, Window: int64(time.Minute)}
	for i := range checks {
		switch i % 5 {
		case 1:
			checks[i].items = []limit.Item{{Key: a, Spec: fw}, {Key: b, Spec: tb}}
		case 3:
			checks[i].items = []limit.Item{{Key: b, Spec: tb}}
		}
	}
	seedRemote(t, batched, checks)
	seedRemote(t, one, checks)
	compareBatched(t, batched, one, checks, chunk, nil)
}

// A call that fails inside the script (here a key of the wrong type) fails
// its own check only: the other checks of its script run are decided, and
// as they would be without it.
func TestRedisBatchCallFailureIsolated(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	mem := NewMemory(MemoryConfig{})
	run := time.Now().UnixNano()
	now := limittest.T0.UnixNano()
	bad := limit.Item{Key: fmt.Appendf(nil, "iso:%d:bad", run), Spec: limit.Spec{Algorithm: limit.SlidingLog, Limit: 3, Window: int64(time.Minute)}}
	if _, err := srv.Do("SET", string(appendRedisKey(nil, &bad)), "not a list"); err != nil {
		t.Fatal(err)
	}
	var checks []batchCheck
	for i := range 7 {
		c := batchCheck{now: now + int64(i)*int64(time.Second), hits: 1}
		for _, alg := range allAlgorithms {
			c.items = append(c.items, limit.Item{
				Key:  fmt.Appendf(nil, "iso:%d:%s", run, alg),
				Spec: limit.Spec{Algorithm: alg, Limit: 4, Window: int64(time.Minute)},
			})
		}
		if i == 2 || i == 5 {
			c.items = append(c.items[:1], bad)
		}
		checks = append(checks, c)
	}
	outs, errs := runDirect(t, s, checks)
	for i, c := range checks {
		if i == 2 || i == 5 {
			if errs[i] == nil || !strings.Contains(errs[i].Error(), "WRONGTYPE") {
				t.Fatalf("check %d on a key of the wrong type: err = %v, want WRONGTYPE", i, errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Fatalf("check %d: %v", i, errs[i])
		}
		want := make([]limit.Decision, len(c.items))
		if err := mem.CheckAt(context.Background(), c.now, c.hits, c.items, want); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(outs[i], want) {
			t.Fatalf("check %d: got %+v, want (Memory) %+v", i, outs[i], want)
		}
	}
}

// When a whole script run fails (here the server hangs past the deadline),
// every check it carried gets the error.
func TestRedisBatchFailsAsAWhole(t *testing.T) {
	srv := redistest.Start(t)
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal})
	now := limittest.T0.UnixNano()
	var checks []batchCheck
	for i := range 6 {
		checks = append(checks, batchCheck{now: now, hits: 1, items: []limit.Item{{
			Key:  fmt.Appendf(nil, "whole:%d", i),
			Spec: limit.Spec{Algorithm: limit.FixedWindow, Limit: 3, Window: int64(time.Minute)},
		}}})
	}
	if _, errs := runDirect(t, s, checks); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...)) // warm: the connection is up
	}
	srv.Pause()
	defer srv.Resume()
	_, errs := runDirectBy(t, s, checks, time.Now().Add(100*time.Millisecond))
	for i, err := range errs {
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("check %d of a hung run: err = %v, want ErrTimeout", i, err)
		}
	}
}
