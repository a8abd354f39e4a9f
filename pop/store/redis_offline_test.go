package store

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/rules"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// A PoP on Redis whose Redis goes away keeps deciding a global limit on what
// it knows of the other PoPs (TestFallbackGlobalLimitWhileRedisAway); the
// other PoP hears of what it admits meanwhile; and when Redis returns —
// emptied by SHUTDOWN NOSAVE, or with its counts kept after a hang — it
// holds those admissions exactly once.
func TestFallbackGlobalLimitWhileRedisAway(t *testing.T) {
	for _, outage := range []string{"shutdown-nosave", "hung"} {
		t.Run(outage, func(t *testing.T) {
			for _, alg := range []limit.Algorithm{limit.FixedWindow, limit.SlidingWindow} {
				t.Run(alg.String(), func(t *testing.T) { testRedisAway(t, outage, alg) })
			}
		})
	}
}

func testRedisAway(t *testing.T, outage string, alg limit.Algorithm) {
	const cooldown = 50 * time.Millisecond
	srvA, srvB := redistest.Start(t), redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.Add(10 * time.Second).UnixNano())
	// PoP a (region eu) on srvA behind its Fallback, PoP b (region us) on srvB.
	a := openTestRedis(t, srvA.URL(), RedisConfig{ClockSource: ClockLocal, Clock: clock.Load, Replica: "a",
		Extrapolate: true, Timeout: 50 * time.Millisecond})
	fa := NewFallback(a, NewMemory(MemoryConfig{Primary: a}), FallbackConfig{Failures: 1, Cooldown: cooldown})
	b := openReplRedis(t, srvB.URL(), "b", clock)
	it := windowItem(rules.Hour, alg, limit.ScopeGlobal, 10, "redis-away")

	if got := admit(t, fa, now, it, 4); got != 4 {
		t.Fatalf("a admitted %d of 4 on its Redis", got)
	}
	deliver(t, a, b)
	if got := admit(t, b, now, it, 3); got != 3 {
		t.Fatalf("b admitted %d of 3", got)
	}
	deliver(t, b, a)

	switch outage {
	case "shutdown-nosave":
		if _, err := srvA.Do("SHUTDOWN", "NOSAVE"); err == nil {
			t.Log("SHUTDOWN NOSAVE answered") // it closes the connection instead, as a rule
		}
		srvA.Kill() // reaps the exited process
	case "hung":
		srvA.Pause()
		t.Cleanup(srvA.Resume)
	}

	// While Redis is away a admits what the global limit has left after
	// both PoPs' hits: 10 − 4 − 3.
	if got := admit(t, fa, now, it, 10); got != 3 {
		t.Fatalf("a admitted %d while its Redis was away, want the 3 the limit had left after a's 4 and b's 3 (stats %+v)",
			got, fa.Stats())
	}
	if fa.Stats().FallbackDecisions == 0 {
		t.Fatalf("no check went to the fallback: %+v", fa.Stats())
	}
	// b hears of them: a publishes its count while its Redis is away.
	d, err := a.DeltaCtx(context.Background())
	if err == nil {
		t.Errorf("Delta with Redis away: no error")
	}
	if len(d) != 1 || d[0].Count != 7 {
		t.Fatalf("a's delta with Redis away %v, want its count 7", d)
	}
	b.Apply(0, d)
	if err := b.ReplicationErr(); err != nil {
		t.Fatal(err)
	}
	if got := admit(t, b, now, it, 5); got != 0 {
		t.Fatalf("b admitted %d after hearing a's count, want 0", got)
	}

	switch outage {
	case "shutdown-nosave":
		srvA.Restart() // empty
	case "hung":
		srvA.Resume()
	}
	time.Sleep(2 * cooldown)
	// Back on Redis, the limit is still spent: a's offline hits are in
	// Redis before its first check there, and so are b's counts.
	var decided uint64
	deadline := time.Now().Add(5 * time.Second)
	for fa.BreakerState() != BreakerClosed || fa.Stats().PrimaryDecisions == decided {
		decided = fa.Stats().PrimaryDecisions
		if time.Now().After(deadline) {
			t.Fatalf("a's breaker %v 5s after Redis returned: %+v", fa.BreakerState(), fa.Stats())
		}
		if got := admit(t, fa, now, it, 1); got != 0 {
			t.Fatalf("a admitted a hit after its Redis returned (stats %+v)", fa.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := admit(t, fa, now, it, 5); got != 0 {
		t.Fatalf("a admitted %d on its returned Redis, want 0", got)
	}
	// Exactly once: Redis holds a's 7, not 7 plus the 3 again, and b's 3.
	win := limit.WindowStart(now, it.Spec.Window)
	v, err := srvA.Do("GET", string(appendRedisKey(nil, &it)))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := ownCount(v, win/it.Spec.Window); err != nil || n != 7 {
		t.Fatalf("a's Redis holds own count %d (%q, %v), want 7", n, v, err)
	}
	h, err := srvA.Do("HGETALL", string(appendRemoteKey(nil, it.Key, win/it.Spec.Window)))
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Split(h, "\n"); !hashHas(f, "=b", 3) {
		t.Fatalf("a's Redis holds remote counts %q, want b's 3", f)
	}
	d, err = a.DeltaCtx(context.Background())
	if err != nil || len(d) != 1 || d[0].Count != 7 {
		t.Fatalf("a's delta after Redis returned %v (%v), want its count 7", d, err)
	}
}

// A check that ran out of time is answered by the fallback while another
// check of the key, already in Redis, takes the window's last hit there:
// without the other's hit each sees room, and both were admitted — 6 of 5.
// The later one is denied, and Redis ends up holding the key's 5.
func TestFallbackTimeoutRaceOnReplicatedKey(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.Add(10 * time.Second).UnixNano())
	a := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Clock: clock.Load, Replica: "a",
		Extrapolate: true, Timeout: 5 * time.Second})
	fa := NewFallback(a, NewMemory(MemoryConfig{Primary: a}), FallbackConfig{})
	it := windowItem(rules.Hour, limit.FixedWindow, limit.ScopeGlobal, 5, "race")
	if got := admit(t, fa, now, it, 4); got != 4 {
		t.Fatalf("admitted %d of the first 4", got)
	}
	srv.Pause()
	t.Cleanup(srv.Resume)
	inRedis := make(chan limit.Decision, 1)
	go func() {
		out := make([]limit.Decision, 1)
		if err := fa.CheckAt(context.Background(), now, 1, []limit.Item{it}, out); err != nil {
			t.Error(err)
		}
		inRedis <- out[0]
	}()
	time.Sleep(100 * time.Millisecond) // the check is in Redis' queue
	// Another check runs out of its time and is answered without Redis.
	out := make([]limit.Decision, 1)
	if err := fa.fallback(context.Background(), now, 1, []limit.Item{it}, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed {
		t.Fatalf("the fallback denied the 5th hit: %+v", out[0])
	}
	srv.Resume()
	if d := <-inRedis; d.Allowed {
		t.Fatalf("Redis's answer admitted a 6th hit of 5 beside the fallback's: %+v", d)
	}
	if got := admit(t, fa, now, it, 3); got != 0 {
		t.Fatalf("admitted %d more", got)
	}
	v, err := srv.Do("GET", string(appendRedisKey(nil, &it)))
	if err != nil {
		t.Fatal(err)
	}
	win := limit.WindowStart(now, it.Spec.Window) / it.Spec.Window
	if n, err := ownCount(v, win); err != nil || n != 5 {
		t.Fatalf("Redis holds %d (%q, %v), want the 5 admitted", n, v, err)
	}
}

// deliver applies from's delta to to.
func deliver(t *testing.T, from, to *Redis) {
	t.Helper()
	d, err := from.DeltaCtx(context.Background())
	if err != nil {
		t.Fatalf("Delta: %v", err)
	}
	to.Apply(0, d) // into Redis and into the estimate
	if err := to.ReplicationErr(); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

// hashHas reports whether an HGETALL reply's fields hold field = n.
func hashHas(f []string, field string, n uint64) bool {
	for i := 0; i+1 < len(f); i += 2 {
		if f[i] == field {
			v, err := strconv.ParseUint(f[i+1], 10, 64)
			return err == nil && v == n
		}
	}
	return false
}

// A PoP on Redis restarted (its own counts restored from its data directory,
// as replication.Persisted.RestoreFrom does) whose Redis then goes away
// decides a global limit on its own count too: its estimate had only the
// other PoPs' counts after a restart, so its fallback re-granted the hits it
// had admitted before (the soak: a Redis PoP 68 ms after a kill -9 admitted
// into a global window already over its limit).
func TestFallbackAfterRestartKnowsOwnCounts(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.Add(10 * time.Second).UnixNano())
	cfg := RedisConfig{ClockSource: ClockLocal, Clock: clock.Load, Replica: "a", Extrapolate: true, Timeout: 50 * time.Millisecond}
	it := windowItem(rules.Hour, limit.SlidingWindow, limit.ScopeGlobal, 10, "restarted")
	before := openTestRedis(t, srv.URL(), cfg)
	if got := admit(t, before, now, it, 6); got != 6 {
		t.Fatalf("admitted %d of 6 before the restart", got)
	}
	own, err := before.OwnCtx(context.Background())
	if err != nil || len(own) != 1 || own[0].Count != 6 {
		t.Fatalf("own slots before the restart: %v, %v", own, err)
	}

	if err := before.Close(); err != nil { // the PoP stops, and leaves the servers of its Redis
		t.Fatal(err)
	}
	after := openTestRedis(t, srv.URL(), cfg) // the restarted PoP, on the same Redis
	after.Restore(own)
	if err := after.ReplicationErr(); err != nil {
		t.Fatal(err)
	}
	fa := NewFallback(after, NewMemory(MemoryConfig{Primary: after}), FallbackConfig{Failures: 1, Cooldown: time.Minute})
	srv.Pause()
	t.Cleanup(srv.Resume)
	if got := admit(t, fa, now, it, 10); got != 4 {
		t.Fatalf("the restarted PoP admitted %d while its Redis was away, want the 4 its own 6 left (stats %+v)", got, fa.Stats())
	}
}
