package store

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/store/redistest"
)

// The Redis store knows which leases a Redis holds only from its lease
// marker (LeaseMarkerKey) on: a Redis that lost its data refuses grants until
// a limit's lease_ttl has passed since, and one whose data survived does not.

// lossClock is an injected clock: the store's Clock and every now given to
// AcquireAt and ReleaseAt, so that no test sleeps for a lease TTL.
type lossClock struct{ ns atomic.Int64 }

func newLossClock() *lossClock {
	c := new(lossClock)
	c.ns.Store(time.Now().Truncate(time.Microsecond).UnixNano())
	return c
}

func (c *lossClock) now() int64                    { return c.ns.Load() }
func (c *lossClock) advance(d time.Duration) int64 { return c.ns.Add(int64(d)) }

// leasesKnown tells s's Redis that its lease sets hold every lease ever
// granted (a marker at the epoch), as a Redis that always kept its data
// would, so a test of something else does not wait out a fresh Redis's
// lease_ttl.
func leasesKnown(t testing.TB, stores ...*Redis) {
	t.Helper()
	for _, s := range stores {
		if err := s.client.Set(context.Background(), LeaseMarkerKey, "0", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
		// The Ping's claim read it (in a Cluster too: one slot with OwnerKey).
		if since, ok := s.LeasesKnownSince(); !ok || since.UnixNano() > int64(time.Minute) {
			t.Fatalf("lease marker as the store read it: %v, %v; want the epoch", since, ok)
		}
	}
}

const lossTTL = 20 * time.Second

func lossItems() []limit.SlotItem {
	return []limit.SlotItem{{Key: slotKey("loss"), Max: 3, TTL: int64(lossTTL)}}
}

// acquireAnswered is AcquireAt at now, retried (at the same now) while it
// fails: the first call after a Redis restart may meet a pooled connection
// to the old process. Bounded by a generous real-time deadline.
func acquireAnswered(t *testing.T, s *Redis, now int64, id byte) (bool, limit.SlotDecision) {
	t.Helper()
	out := make([]limit.SlotDecision, 1)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := s.AcquireAt(context.Background(), now, leaseID(id), lossItems(), out)
		if err == nil {
			return ok, out[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquire %d: Redis did not answer within 20 s: %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// holdAll takes the 3 slots of lossItems for ids first… at now and checks
// that a fourth is denied as full.
func holdAll(t *testing.T, s *Redis, now int64, first byte) {
	t.Helper()
	for id := first; id < first+3; id++ {
		if ok, d := acquireAnswered(t, s, now, id); !ok {
			t.Fatalf("acquisition %d of 3 at %v denied: %+v", id-first+1, time.Unix(0, now), d)
		}
	}
	if ok, d := acquireAnswered(t, s, now, first+3); ok || d.InFlight != 3 {
		t.Fatalf("a fourth acquisition with 3 of 3 held: admitted %v, %+v", ok, d)
	}
}

// 3 of 3 held, redis-server killed and started again empty on the same port
// while the PoP runs: the next acquisitions are refused, with Retry-After the
// rest of the lease TTL since the loss was seen, releases still answer, a
// server of the PoP that starts meanwhile refuses too, and once the TTL has
// passed 3 are granted again — never 6 in flight.
func TestRedisLeasesWaitOutRestartWithoutPersistence(t *testing.T) {
	srv := redistest.Start(t)
	clk := newLossClock()
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Clock: clk.now})

	// A fresh Redis cannot be told from an emptied one: its first user
	// waits too, from the server's start at the latest.
	if ok, d := acquireAnswered(t, s, clk.now(), 1); ok || d.RetryAfter <= 0 || d.RetryAfter > int64(lossTTL) {
		t.Fatalf("first acquisition on a fresh Redis: admitted %v, %+v; want refused for up to the TTL", ok, d)
	}
	holdAll(t, s, clk.advance(lossTTL), 1)

	srv.Restart() // no persistence: every lease is gone
	lost := clk.advance(time.Second)
	ok, d := acquireAnswered(t, s, lost, 10)
	if ok {
		t.Fatalf("granted a slot right after Redis lost the 3 held: 4 in flight against a max of 3")
	}
	if d.RetryAfter != int64(lossTTL) || d.Remaining != 0 {
		t.Fatalf("refusal after the loss: %+v; want Retry-After the whole TTL %v (the loss was seen at this instant)", d, lossTTL)
	}
	if got := s.LeaseLossDenials(); got < 2 {
		t.Fatalf("LeaseLossDenials = %d, want the fresh Redis's and this one", got)
	}
	// Releases keep working: a lost lease is unknown, not an error.
	if st, err := s.ReleaseAt(context.Background(), lost, limit.Lease{ID: leaseID(1), Keys: []limit.SlotKey{lossItems()[0].Key}}); err != nil || st != limit.Unknown {
		t.Fatalf("release of a lost lease: %v, %v; want unknown, no error", st, err)
	}

	// Another server of the PoP, started now, knows it from the marker.
	s2 := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Clock: clk.now})
	if ok, d := acquireAnswered(t, s2, clk.advance(2*time.Second), 11); ok || d.RetryAfter != int64(lossTTL-2*time.Second) {
		t.Fatalf("a server started after the loss: admitted %v, %+v; want refused until the TTL since the loss", ok, d)
	}
	for i, at := range []time.Duration{lossTTL / 2, lossTTL - time.Microsecond} {
		clk.ns.Store(lost + int64(at))
		if ok, d := acquireAnswered(t, s, clk.now(), byte(12+i)); ok {
			t.Fatalf("granted %v after the loss, before the TTL %v: %+v", at, lossTTL, d)
		}
	}
	clk.ns.Store(lost + int64(lossTTL))
	holdAll(t, s, clk.now(), 20)
}

// A PoP that starts against a Redis that restarted empty while the PoP was
// down (nobody watched it go) refuses grants until the TTL has passed since
// the Redis started, then grants.
func TestRedisLeasesPoPStartAfterRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	clk := newLossClock()
	a := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Clock: clk.now})
	leasesKnown(t, a)
	holdAll(t, a, clk.now(), 1)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	srv.Restart()
	clk.ns.Store(time.Now().UnixNano()) // the PoP's start, right after Redis's
	b := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Clock: clk.now})
	since, ok := b.LeasesKnownSince()
	if !ok {
		t.Fatal("the store did not read the lease marker at open")
	}
	if age := time.Duration(clk.now() - since.UnixNano()); age < time.Second || age > 30*time.Second {
		t.Fatalf("lease marker %v before the PoP's start; want the Redis's start (a second early for rounding)", age)
	}
	if ok, d := acquireAnswered(t, b, clk.now(), 10); ok {
		t.Fatalf("a PoP started on an emptied Redis granted a slot at once: %+v", d)
	}
	if ok, _ := acquireAnswered(t, b, since.UnixNano()+int64(lossTTL)-1000, 11); ok {
		t.Fatal("granted a microsecond before the TTL since Redis's start")
	}
	holdAll(t, b, since.UnixNano()+int64(lossTTL), 20)
}

// A Redis flushed under a running PoP (FLUSHALL, no restart, no new
// connection, no Ping in between) is caught by the acquisition's own script.
func TestRedisLeasesFlushedWaits(t *testing.T) {
	srv := redistest.Start(t)
	clk := newLossClock()
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Clock: clk.now})
	leasesKnown(t, s)
	holdAll(t, s, clk.now(), 1)
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	now := clk.advance(time.Second)
	if ok, d := acquireAnswered(t, s, now, 10); ok || d.RetryAfter != int64(lossTTL) {
		t.Fatalf("after FLUSHALL: admitted %v, %+v; want refused for the TTL", ok, d)
	}
	if since, _ := s.LeasesKnownSince(); since.UnixNano() != now {
		t.Fatalf("lease marker %v, want the acquisition's now %v", since, time.Unix(0, now))
	}
	holdAll(t, s, now+int64(lossTTL), 20)
}

// With persistence the leases survive a restart, and so does the marker:
// no wait, the 3 held are still held, and a release frees one at once.
func TestRedisLeasesSurvivePersistentRestart(t *testing.T) {
	srv := redistest.StartWithArgs(t, "--appendonly", "yes", "--appendfsync", "always")
	clk := newLossClock()
	s := openTestRedis(t, srv.URL(), RedisConfig{ClockSource: ClockLocal, Clock: clk.now})
	holdAll(t, s, clk.advance(lossTTL), 1) // past a fresh Redis's wait
	before := s.LeaseLossDenials()

	srv.Restart() // reloads the AOF
	now := clk.advance(time.Second)
	ok, d := acquireAnswered(t, s, now, 10)
	if ok || d.InFlight != 3 || d.RetryAfter != int64(lossTTL-time.Second) {
		t.Fatalf("after a restart with AOF: admitted %v, %+v; want full with the 3 leases restored, Retry-After the oldest's expiry", ok, d)
	}
	if got := s.LeaseLossDenials(); got != before {
		t.Fatalf("LeaseLossDenials went from %d to %d: a Redis that kept its leases was taken for an emptied one", before, got)
	}
	st, err := s.ReleaseAt(context.Background(), now, limit.Lease{ID: leaseID(1), Keys: []limit.SlotKey{lossItems()[0].Key}})
	if err != nil || st != limit.Released {
		t.Fatalf("release of a lease held across the restart: %v, %v", st, err)
	}
	if ok, d := acquireAnswered(t, s, now, 11); !ok {
		t.Fatalf("the slot freed by the release was not granted at once: %+v", d)
	}
}

// In a Cluster the marker is checked by the claim (here the Ping's): once it
// has seen the marker gone, the store refuses grants for the TTL itself.
func TestRedisClusterLeasesWaitAfterMarkerLost(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	clk := newLossClock()
	s := openTestRedis(t, nodes[0].Addr+","+nodes[1].Addr+","+nodes[2].Addr, RedisConfig{ClockSource: ClockLocal, Clock: clk.now})
	leasesKnown(t, s)
	holdAll(t, s, clk.now(), 1)
	// The marker's node and the set's lost their data (as restarts without
	// persistence would).
	for _, k := range []string{LeaseMarkerKey, string(appendLeaseKey(nil, lossItems()[0].Key))} {
		if err := s.client.Del(context.Background(), k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	lost := clk.advance(time.Second)
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ok, d := acquireAnswered(t, s, lost, 10); ok || d.RetryAfter != int64(lossTTL) {
		t.Fatalf("after the marker's loss: admitted %v, %+v; want refused for the TTL", ok, d)
	}
	if ok, _ := acquireAnswered(t, s, lost+int64(lossTTL)-1000, 11); ok {
		t.Fatal("granted before the TTL had passed since the loss")
	}
	if ok, d := acquireAnswered(t, s, lost+int64(lossTTL), 12); !ok {
		t.Fatalf("refused once the TTL had passed: %+v", d)
	}
}
