package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// countStore counts the checks that reached it and the instant of the last.
type countStore struct {
	checks chan int64
}

func (c *countStore) CheckAt(_ context.Context, now, _ int64, _ []limit.Item, _ []limit.Decision) error {
	c.checks <- now
	return nil
}

// A held store lets pop-scope checks through at once, holds checks that
// have a region or global item until release (or their context ends), and
// checks those at the instant they were let through, not the one they came
// in with.
func TestHoldStore(t *testing.T) {
	inner := &countStore{checks: make(chan int64, 4)}
	h := newHoldStore(inner)
	popItem := []limit.Item{{Key: []byte("p"), Scope: limit.ScopePOP}}
	mixed := []limit.Item{{Key: []byte("p"), Scope: limit.ScopePOP}, {Key: []byte("g"), Scope: limit.ScopeGlobal}}
	out := make([]limit.Decision, 2)

	if err := h.CheckAt(context.Background(), 1, 1, popItem, out[:1]); err != nil {
		t.Fatal(err)
	}
	if got := <-inner.checks; got != 1 {
		t.Errorf("a pop-scope check reached the store at %d, want 1", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := h.CheckAt(ctx, 1, 1, mixed, out); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a held check whose context ended: %v, want context.DeadlineExceeded", err)
	}
	if len(inner.checks) != 0 {
		t.Fatal("a held check reached the store before release")
	}

	done := make(chan error, 1)
	go func() { done <- h.CheckAt(context.Background(), 1, 1, mixed, out) }()
	time.Sleep(30 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("a check of a global item went through before release: %v", err)
	default:
	}
	h.release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := <-inner.checks; got < 1+int64(30*time.Millisecond) {
		t.Errorf("a held check was checked at %d, want at least the %d it waited later", got, 1+int64(30*time.Millisecond))
	}
	h.release() // again: nothing
	if err := h.CheckAt(context.Background(), 5, 1, mixed, out); err != nil || <-inner.checks != 5 {
		t.Errorf("after release a check of a global item is not checked at once, at its instant")
	}
}
