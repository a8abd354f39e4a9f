package quota_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/quota/pgtest"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With PostgreSQL refusing connections, the Syncer reports the store
// unreachable (edgelimit_quota_store_up 0) and logs the failed change
// notifications once, retrying with backoff, not every second. With
// PostgreSQL answering, it reports it reachable. Before, the line was logged
// at every retry, once a second, and nothing told the store was down.
func TestSyncerStoreDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	pg, err := quota.NewPostgres("postgres://edgeadmin@" + addr + "/quotas_db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	var log lockedBuffer
	s := &quota.Syncer{Store: pg, Index: &quota.Index{}, Poll: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&log, nil))}
	if err := s.Start(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if s.Reachable() {
		t.Fatal("Reachable() after a start on a refusing PostgreSQL: want false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	time.Sleep(6 * time.Second) // six retries a second apart before
	cancel()
	<-done
	if s.Reachable() {
		t.Error("Reachable() while PostgreSQL refuses: want false")
	}
	if n := strings.Count(log.String(), "change notifications failed"); n != 1 {
		t.Errorf("%d lines of failed change notifications in 6 s; want 1 (the first of the run):\n%s", n, log.String())
	}

	ok := &quota.Syncer{Store: pgtest.Store(t), Index: &quota.Index{}}
	if err := ok.Start(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if !ok.Reachable() {
		t.Error("Reachable() after a start on an answering PostgreSQL: want true")
	}
}
