package store

import (
	"context"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/limit/limittest"
)

// A store that saved what TakeStates returned and restored it into a new
// store (a restart) goes on exactly where it was, for every algorithm: a key
// at its limit stays denied, a key with room keeps the same room.
func TestTakeStatesRestoreAfterRestart(t *testing.T) {
	now := limittest.T0.UnixNano()
	algs := []limit.Algorithm{limit.SlidingWindow, limit.FixedWindow, limit.TokenBucket, limit.GCRA, limit.SlidingLog}
	before := NewMemory(MemoryConfig{Durable: true})
	spec := func(a limit.Algorithm) limit.Spec {
		return limit.Spec{Algorithm: a, Limit: 10, Window: int64(time.Hour)}
	}
	check := func(s *Memory, a limit.Algorithm, key string, at int64) limit.Decision {
		out := make([]limit.Decision, 1)
		if err := s.CheckAt(context.Background(), at, 1, []limit.Item{{Key: []byte(key), Spec: spec(a)}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	for _, a := range algs {
		for range 10 {
			check(before, a, "full:"+a.String(), now)
		}
		for range 4 {
			check(before, a, "half:"+a.String(), now)
		}
	}
	changed, gone := before.TakeStates()
	if len(changed) != 2*len(algs) || len(gone) != 0 {
		t.Fatalf("TakeStates: %d changed, %d gone; want %d and 0", len(changed), len(gone), 2*len(algs))
	}
	if c, g := before.TakeStates(); len(c)+len(g) != 0 {
		t.Fatalf("a second TakeStates with nothing new returned %d records, %d gone", len(c), len(g))
	}
	after := NewMemory(MemoryConfig{Durable: true})
	for _, r := range changed {
		if ok, err := after.RestoreState(now, r.Key, r.Value); err != nil || !ok {
			t.Fatalf("RestoreState(%q) = %v, %v", r.Key, ok, err)
		}
	}
	later := now + int64(time.Second)
	for _, a := range algs {
		t.Run(a.String(), func(t *testing.T) {
			if d := check(after, a, "full:"+a.String(), later); d.Allowed {
				t.Fatalf("restored key at its limit was allowed: %+v", d)
			}
			want := check(before, a, "half:"+a.String(), later)
			if got := check(after, a, "half:"+a.String(), later); got != want {
				t.Fatalf("restored key decides %+v, the original %+v", got, want)
			}
		})
	}
}

// Keys the sweep removes are reported gone, and a record already expired is
// not restored.
func TestTakeStatesGoneAndExpired(t *testing.T) {
	now := limittest.T0.UnixNano()
	s := NewMemory(MemoryConfig{Durable: true})
	out := make([]limit.Decision, 1)
	sp := limit.Spec{Algorithm: limit.FixedWindow, Limit: 5, Window: int64(time.Second)}
	s.CheckAt(context.Background(), now, 1, []limit.Item{{Key: []byte("k"), Spec: sp}}, out)
	changed, _ := s.TakeStates()
	if n := s.SweepAt(now + int64(time.Minute)); n != 1 {
		t.Fatalf("sweep removed %d keys, want 1", n)
	}
	if _, gone := s.TakeStates(); len(gone) != 1 || gone[0] != "k" {
		t.Fatalf("gone = %q, want [k]", gone)
	}
	fresh := NewMemory(MemoryConfig{Durable: true})
	if ok, err := fresh.RestoreState(now+int64(time.Minute), changed[0].Key, changed[0].Value); ok || err != nil {
		t.Fatalf("an expired record was restored: %v, %v", ok, err)
	}
	if _, err := fresh.RestoreState(now, "k", []byte{1, 2, 3}); err == nil {
		t.Fatal("a short record restored without error")
	}
}

// A key admitting more hits between two TakeStates than the change log holds
// makes its shard save whole, not grow the log.
func TestChangeLogBounded(t *testing.T) {
	now := limittest.T0.UnixNano()
	s := NewMemory(MemoryConfig{Durable: true, MaxKeys: 256 * 4})
	out := make([]limit.Decision, 1)
	items := []limit.Item{{Key: []byte("hot"), Spec: limit.Spec{Limit: 1 << 30, Window: int64(time.Hour)}}}
	for range 10 * s.maxChangeLog() {
		s.CheckAt(context.Background(), now, 1, items, out)
	}
	for i := range s.changes {
		if n := len(s.changes[i].hashes); n > s.maxChangeLog() {
			t.Fatalf("shard %d log holds %d hashes, bound %d", i, n, s.maxChangeLog())
		}
	}
	if changed, _ := s.TakeStates(); len(changed) != 1 {
		t.Fatalf("TakeStates returned %d records, want the one hot key", len(changed))
	}
}
