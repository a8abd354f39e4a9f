package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// A second PoP pointed at a Redis that holds another PoP's counts does not
// start, and the error names both PoPs and the fix.
func TestRedisOwnerRefusesSecondPoP(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	openReplRedis(t, srv.URL(), "eu-1", clock)
	_, err := OpenRedis(RedisConfig{URL: srv.URL(), ClockSource: ClockLocal, Clock: clock.Load, Replica: "eu-2"})
	if !errors.Is(err, ErrReplicaConflict) {
		t.Fatalf("OpenRedis as eu-2 on eu-1's Redis: err = %v, want ErrReplicaConflict", err)
	}
	for _, want := range []string{`"eu-1"`, `"eu-2"`, "its own Redis", "DEL " + OwnerKey} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if got, _ := srv.Do("GET", OwnerKey); got != "eu-1" {
		t.Fatalf("marker = %q after the refusal, want eu-1's unchanged", got)
	}
	// A server without --pop on a PoP's Redis would have its hits published
	// as that PoP's: refused too.
	_, err = OpenRedis(RedisConfig{URL: srv.URL(), ClockSource: ClockLocal, Clock: clock.Load})
	if !errors.Is(err, ErrReplicaConflict) || !strings.Contains(err.Error(), "--pop eu-1") {
		t.Fatalf("OpenRedis without a replica on eu-1's Redis: err = %v, want a conflict naming --pop eu-1", err)
	}
	// Another database of the same server is another set of keys: allowed.
	openReplRedis(t, dbURL(srv, 1), "eu-2", clock)
}

// The servers of one PoP share its Redis under one name, and count every
// hit once: both take traffic on a global limit of 100 and together admit
// exactly 100, and the PoP publishes 100.
func TestRedisOwnerServersOfOnePoP(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.Add(5 * time.Second).UnixNano())
	a := openReplRedis(t, srv.URL(), "eu-1", clock)
	b := openReplRedis(t, srv.URL(), "eu-1", clock)
	it := replItem("k", 100, limit.ScopeGlobal)
	admitted := 0
	for range 75 {
		admitted += admit(t, a, now, it, 1) + admit(t, b, now, it, 1)
	}
	if admitted != 100 {
		t.Fatalf("two servers of one PoP admitted %d of 150 on a limit of 100, want 100", admitted)
	}
	var total uint64
	for _, s := range []*Redis{a, b} {
		d, err := s.DeltaCtx(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, sl := range d {
			if sl.Replica != "eu-1" {
				t.Fatalf("slot %v published under another name", sl)
			}
			total = max(total, sl.Count) // every server publishes the PoP's absolute count
		}
	}
	if total != 100 {
		t.Fatalf("the PoP publishes %d, want 100", total)
	}
}

// After a Redis restart another PoP may claim the Redis first. The store
// finds it on its next new connection (or its next Ping), stops deciding on
// that Redis and stops publishing what it holds, and says so in Ping (so
// /readyz fails); once the operator gives the PoPs their own servers and
// deletes the marker, it claims the Redis again and recovers by itself.
func TestRedisOwnerConflictAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	now := clock.at(limittest.T0.Add(5 * time.Second).UnixNano())
	a := openReplRedis(t, srv.URL(), "eu-1", clock)
	it := replItem("k", 100, limit.ScopeGlobal)
	if admit(t, a, now, it, 3) != 3 {
		t.Fatal("a check was denied on an empty limit")
	}
	srv.Restart() // it keeps nothing
	if _, err := srv.Do("SET", OwnerKey, "eu-2"); err != nil {
		t.Fatal(err)
	}
	out := make([]limit.Decision, 1)
	var err error
	for range 3 { // the first check may meet the connection the restart broke
		if err = a.CheckAt(context.Background(), now, 1, []limit.Item{it}, out); errors.Is(err, ErrReplicaConflict) {
			break
		}
	}
	if !errors.Is(err, ErrReplicaConflict) {
		t.Fatalf("check on a Redis eu-2 claimed: err = %v, want ErrReplicaConflict", err)
	}
	if err := a.Ping(context.Background()); !errors.Is(err, ErrReplicaConflict) || !strings.Contains(err.Error(), `"eu-2"`) {
		t.Fatalf("Ping: %v, want ErrReplicaConflict naming eu-2", err)
	}
	if d, err := a.DeltaCtx(context.Background()); !errors.Is(err, ErrReplicaConflict) || len(d) != 0 {
		t.Fatalf("Delta in conflict = %v, %v; want nothing and ErrReplicaConflict", d, err)
	}
	if got, _ := srv.Do("GET", OwnerKey); got != "eu-2" {
		t.Fatalf("marker = %q, want eu-2's untouched", got)
	}

	if _, err := srv.Do("DEL", OwnerKey); err != nil {
		t.Fatal(err)
	}
	if err := a.Ping(context.Background()); err != nil {
		t.Fatalf("Ping after the marker was deleted: %v", err)
	}
	if got, _ := srv.Do("GET", OwnerKey); got != "eu-1" {
		t.Fatalf("marker = %q after the Ping, want eu-1", got)
	}
	if err := a.CheckAt(context.Background(), now, 1, []limit.Item{it}, out); err != nil || !out[0].Allowed {
		t.Fatalf("check after recovery: %v allowed=%v", err, out[0].Allowed)
	}
}

// A Redis restart loses the marker; the store's Ping writes it again, so a
// second PoP that starts afterwards is still refused.
func TestRedisOwnerReclaimedAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	clock := new(replClock)
	a := openReplRedis(t, srv.URL(), "eu-1", clock)
	srv.Restart()
	var err error
	for range 3 { // the first ping may meet the connection the restart broke
		if err = a.Ping(context.Background()); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("Ping after restart: %v", err)
	}
	if got, _ := srv.Do("GET", OwnerKey); got != "eu-1" {
		t.Fatalf("marker = %q after the restart and a Ping, want eu-1", got)
	}
	if _, err := OpenRedis(RedisConfig{URL: srv.URL(), ClockSource: ClockLocal, Clock: clock.Load, Replica: "eu-2"}); !errors.Is(err, ErrReplicaConflict) {
		t.Fatalf("eu-2 after the restart: err = %v, want ErrReplicaConflict", err)
	}
}
