package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/quota"
)

// hangingStore answers the load at start, then never answers again: a
// PostgreSQL behind a dropped route, or hung, that accepts and never replies.
type hangingStore struct {
	quota.Store
}

func (hangingStore) Snapshot(context.Context) ([]*quota.Quota, int64, error) { return nil, 1, nil }

func (hangingStore) ChangesSince(ctx context.Context, _ int64) ([]quota.Change, int64, error) {
	<-ctx.Done()
	return nil, 0, ctx.Err()
}

func (hangingStore) Watch(ctx context.Context, _ func()) error {
	<-ctx.Done()
	return ctx.Err()
}

// A store that stops answering is reported unreachable
// (edgelimit_quota_store_up 0, and so the EdgelimitQuotaStoreUnreachable
// alert) once a sync passes its deadline. Before, a sync had no deadline: it
// waited for PostgreSQL for good, the poll never ran again, and the PoP
// reported the store up for as long as it was black-holed.
func TestSyncerStoreHangs(t *testing.T) {
	s := &quota.Syncer{Store: hangingStore{}, Index: &quota.Index{}, Poll: 50 * time.Millisecond, Timeout: 200 * time.Millisecond}
	if err := s.Start(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if !s.Reachable() {
		t.Fatal("Reachable() after a load that succeeded: want true")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for end := time.Now().Add(5 * time.Second); s.Reachable(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("Reachable() still true 5 s into a store that never answers a sync; want false once a sync passes its deadline")
		}
	}
}
