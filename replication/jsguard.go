package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats-server/v2/server"
)

// ErrJetStreamDiskFull is returned by StoreGuard.Full while the JetStream
// store of the embedded NATS server cannot write: its disk has less free space
// than the guard's minimum, or nats-server met ENOSPC and has not written
// since. The PoP goes on deciding from its own store; what it counts is
// published again once the stream writes (a publish that fails keeps its
// slots for the next flush, and snapshots carry every own count).
var ErrJetStreamDiskFull = errors.New("replication: JetStream store: disk full")

// MsgNotAcknowledged is the message of the Replicator's warning (at most
// once a second) that JetStream did not acknowledge a publish; a caller that
// knows why (a full JetStream store, StoreGuard) may demote it.
const MsgNotAcknowledged = "replication: message not acknowledged"

// storeLook is how often a StoreGuard looks at the store's free space.
const storeLook = time.Second

// StoreGuard watches the JetStream store directory of an embedded NATS
// server (ServerConfig.Guard) for a full disk.
//
// Why it is needed: on the first ENOSPC, nats-server 2.15 marks the stream's
// file store with a "critical write error" and refuses every later write of
// that stream, answering no publish, until JetStream is restarted, even after
// space has come back; and it logs an error for every message refused. (A
// stream sourcing from another region meets it as "JetStream out of space,
// will be DISABLED", and JetStream shuts down.)
//
// What it does: it marks the store full when the free space of its
// filesystem falls under MinFree or when nats-server logs "no space left"
// (the server's log goes through the guard); it logs once when the store
// becomes full and once when it writes again, and demotes nats-server's
// further "no space left" lines to debug in between. It looks at the free
// space every second (a statfs); once MinFree is free again it restarts
// JetStream if the server met ENOSPC or shut JetStream down — the stream is
// recovered from its files, and clients' ordered consumers recreate
// themselves — and marks the store writable. Safe for concurrent use.
type StoreGuard struct {
	minFree int64 // <= 0: free space is not looked at, only ENOSPC
	log     *slog.Logger

	noSpace atomic.Bool  // the server logged ENOSPC since the last look
	full    atomic.Bool  // the store counts as full
	quiet   atomic.Bool  // the server's ENOSPC lines go to debug
	trips   atomic.Int64 // times the store became full
	restart atomic.Int64 // JetStream restarts after a full disk

	mu     sync.Mutex
	srv    *server.Server // set by StartServer; requires mu
	dir    string         // the store directory; requires mu
	js     server.JetStreamConfig
	reason string // why full; requires mu
	hit    bool   // the server met ENOSPC while full: restart JetStream; requires mu
}

// NewStoreGuard returns a guard that counts the store full below minFree
// bytes free (<= 0: only when nats-server meets ENOSPC). Set it as
// ServerConfig.Guard and run Run once the server started.
func NewStoreGuard(minFree int64, log *slog.Logger) *StoreGuard {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &StoreGuard{minFree: minFree, log: log}
}

// attach binds the guard to the server StartServer started.
func (g *StoreGuard) attach(s *server.Server, opts *server.Options) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.srv, g.dir = s, opts.StoreDir
	g.js = server.JetStreamConfig{StoreDir: opts.StoreDir, MaxMemory: opts.JetStreamMaxMemory,
		MaxStore: opts.JetStreamMaxStore, Domain: opts.JetStreamDomain}
}

// serverLine is called with every warning and error line of the server: it
// notes ENOSPC, and reports whether the line should be demoted to debug (the
// store is known full and the line says so again).
func (g *StoreGuard) serverLine(msg string) (demote bool) {
	if !strings.Contains(msg, "no space left") && !strings.Contains(msg, "out of space") {
		return false
	}
	g.noSpace.Store(true)
	return !g.quiet.CompareAndSwap(false, true)
}

// Full returns ErrJetStreamDiskFull with the reason while the store cannot
// write, or nil. It does not look at the disk: Run does.
func (g *StoreGuard) Full() error {
	if !g.full.Load() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return fmt.Errorf("%w: %s (%s; writes resume when %d MiB are free)", ErrJetStreamDiskFull, g.reason, g.dir, max(g.minFree, 0)>>20)
}

// GuardStats are a StoreGuard's counters.
type GuardStats struct {
	Trips    int64 // times the store became full
	Restarts int64 // JetStream restarts once space returned after ENOSPC
}

// Stats returns the guard's counters.
func (g *StoreGuard) Stats() GuardStats {
	return GuardStats{Trips: g.trips.Load(), Restarts: g.restart.Load()}
}

// Run looks at the store every second until ctx is done.
func (g *StoreGuard) Run(ctx context.Context) {
	t := time.NewTicker(storeLook)
	defer t.Stop()
	for {
		g.look()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// look is one look at the store: it marks it full, or once space returned
// restarts JetStream if needed and marks it writable again.
func (g *StoreGuard) look() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.srv == nil {
		return
	}
	avail, known := freeSpace(vfs.Default, g.dir)
	low := known && g.minFree > 0 && avail < g.minFree
	hit := g.noSpace.Swap(false)
	off := !g.srv.JetStreamEnabled() && g.srv.Running()
	if !g.full.Load() {
		var reason string
		switch {
		case hit:
			reason = "nats-server met ENOSPC writing the stream"
		case off:
			reason = "nats-server shut JetStream down"
		case low:
			reason = fmt.Sprintf("free space %d MiB, under the minimum of %d MiB", avail>>20, g.minFree>>20)
		default:
			return
		}
		g.reason, g.hit = reason, hit || off
		g.full.Store(true)
		g.trips.Add(1)
		g.log.Error("replication: JetStream store disk full; deciding from the local store, publishing again once space returns",
			"dir", g.dir, "reason", reason, "free_mib", avail>>20, "min_free_mib", max(g.minFree, 0)>>20)
		return
	}
	g.hit = g.hit || hit || off
	if low || !known && hit {
		return // still full, or no way to tell: ENOSPC again
	}
	if g.hit {
		// The stream's file store refuses every write after ENOSPC until
		// JetStream restarts; restarting recovers it from its files.
		if g.srv.JetStreamEnabled() {
			_ = g.srv.ShutdownJetStream()
		}
		js := g.js
		if err := g.srv.EnableJetStream(&js); err != nil {
			g.reason = "JetStream does not restart after the disk was full: " + err.Error()
			return // tried again at the next look; Full says why
		}
		g.restart.Add(1)
	}
	g.full.Store(false)
	g.quiet.Store(false)
	g.hit = false
	g.log.Info("replication: JetStream store writes again", "dir", g.dir, "free_mib", avail>>20, "restarted_jetstream", g.restart.Load())
}
