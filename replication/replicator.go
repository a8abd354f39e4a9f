package replication

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/replication/core"
)

// ErrRunning is returned by Run when the Replicator is already running.
var ErrRunning = errors.New("replication: replicator already running")

// Replicator moves one PoP's counts to and from the other PoPs over NATS
// JetStream. Run drives it; Stats reads its counters.
//
// It is the JetStream driver of the replication protocol in
// replication/core: one goroutine (the loop) owns the core and calls Tick at
// its deadlines, Step for every message the NATS callbacks decoded,
// BitsIssued and Urgent on the store's news, Failed for what JetStream did
// not acknowledge, and carries out each Ready: save (Saver), publish, apply,
// rescale global limits (Config.SetGlobalShare). What follows is the
// protocol as this driver carries it.
//
// Model. Every FlushInterval the Replicator takes Counts.Delta (this PoP's
// own slots that changed, with their absolute counts), splits it into
// DeltaBatch messages that fit a NATS message, and publishes them
// asynchronously to the PoP's subject in its region's stream, each with a
// Nats-Msg-Id of "<pop>-<seq>". A batch that fails, or is not acknowledged
// within AckTimeout, is not lost: its slots join the next flush (by per-slot
// maximum, which is right since they are absolute counts). Every
// SnapshotInterval it publishes Counts.Own as Snapshot messages
// (anti-entropy). It reads its own region's stream, which holds every
// region's messages, with an ordered consumer from StartSeq on, and applies
// every other PoP's batches and snapshots with Counts.Apply; its own messages
// are skipped.
//
// Bits. When Config.Bits is set, every FlushInterval the Replicator also
// takes Bits.BitsDelta, joins it (latest Until per key and scope) with the
// bits whose publish failed before, and publishes them as MitigationBatch
// messages on the PoP's bits subject, every bit stamped with the flush time
// as issued_unix_nano; a batch that fails or is not acknowledged keeps its
// bits for the next flush. It keeps every bit it published until it expires,
// and carries the active ones in each snapshot (as Snapshot messages with
// bits and no slots), so a PoP that missed a batch, or restarted, learns them
// within SnapshotInterval, or within a beacon interval of a heal. Received
// bits, from batches and snapshots alike, are filtered (region.AcceptBit) and
// joined with Bits.ApplyBits.
//
// A message that does not decode, fails Validate, needs a newer
// schema, names another PoP than its subject, or has an unknown subject is
// dropped, counted in Stats and logged (at most once a second per reason).
// What decodes but no PoP of the topology could have sent — a replica outside
// Topology, slots or bits not the sender's own, counts and bits' ends past
// Config.Bounds — the core refuses or clamps (core.Reject); those are counted
// in Stats.Rejected and logged the same way (reject.go).
//
// Across regions the stream is the durable path, and two direct ones over
// core NATS keep counts moving while stream sourcing is down or slow to
// resume (see StartServer, "How regions are linked"): other regions' snapshots
// are always applied straight off their subjects; numbered presence beacons
// tell a PoP when it may have missed another PoP's messages, and it then
// publishes a snapshot at once; and while the stream's source of a region is
// stalled, that region's delta batches are applied straight off their
// subjects too. With Config.Direct a third path takes other regions' hot
// slots (keys near their limit, published again off the stream: HotCounts)
// and bits off their subjects on connections of their own, all the time, so
// that a link held up behind a lost segment does not hold them.
// Whatever arrives twice is joined twice, which changes nothing.
//
// Why an ordered consumer, not a durable one: the durable layer already
// persists the stream position (OnApplied) next to the merged counts it
// belongs to, so server-side consumer state would be a second copy that can
// disagree with it; an ordered consumer is ephemeral (nothing to clean up
// when a PoP goes away), needs no acks, is flow-controlled, and recreates
// itself from the last sequence it delivered after any gap or reconnect.
// Replaying from an older position is harmless: joins are idempotent.
//
// Seq. Batch numbers start at the wall clock's unix nanoseconds when the
// Replicator is created and count up by one per message (the core numbers
// its messages; a message split in several parts numbers them on from its
// number, and the next message starts past the last part), so they grow across
// restarts without being persisted (unless the clock steps back by more than
// the restart took), and the Nats-Msg-Id of a new batch never repeats one
// inside the stream's duplicate window.
//
// The check path never touches the Replicator; a NATS outage only delays
// replication. A Replicator runs once; it is safe for concurrent use (Stats
// may be called from any goroutine).
type Replicator struct {
	cfg    Config
	log    *slog.Logger
	js     jetstream.JetStream
	admin  jetstream.JetStream // Config.Admin's; nil without
	stream string
	limit  logLimiter

	running atomic.Bool
	ready   chan struct{} // closed once the stream consumer runs
	// caught is closed once the loop applied the stream up to catchUpTo,
	// the stream's last sequence when the consumer started (CaughtUp).
	caught     chan struct{}
	catchUpTo  atomic.Uint64
	caughtOnce sync.Once

	mu   sync.Mutex // guards core; held only around core calls, never over IO
	core *core.Core
	// clock is the correction of the wall clock the core last agreed on, ns:
	// every time handed to the core is the wall clock plus it.
	clock atomic.Int64

	// Owned by the loop.
	seq     uint64 // the next Nats-Msg-Id number; see "Seq"
	pending int    // ack groups not yet reported on acks
	unacked int    // delta slots published and not yet acknowledged or failed

	in   chan inbound  // decoded messages from the NATS callbacks, to the loop
	acks chan ackGroup // publish results, to the loop
	quit chan struct{} // closed when the loop is gone

	published, publishedSlots, publishedBytes atomic.Uint64
	publishedSnaps, publishedSnapSlots        atomic.Uint64
	publishFailures, retryOverflows           atomic.Uint64
	retrySlots                                atomic.Int64
	applied, appliedSlots                     atomic.Uint64
	appliedSnaps, appliedSnapSlots, direct    atomic.Uint64
	directBatches, directSlots                atomic.Uint64
	hotBatches                                atomic.Uint64
	stalledSources                            atomic.Int64
	streamErr                                 atomic.Pointer[error] // StreamErr; nil while the stream is as expected
	streamBytes                               atomic.Uint64         // the stream's size at the last look
	jsFull                                    atomic.Pointer[error] // JetStreamFull; nil while publishes are stored
	jsFullSince, jsRefusedAt                  atomic.Int64
	skippedOwn, lastSeq                       atomic.Uint64
	dropped                                   [NumDropReasons]atomic.Uint64
	lag                                       lagHistogram

	publishedBits, publishedBitBatches, publishedSnapBits atomic.Uint64
	retryBitsN                                            atomic.Int64
	appliedBits, appliedSnapBits                          atomic.Uint64
	droppedBits                                           [NumBitDropReasons]atomic.Uint64
	rejected                                              [NumRejectReasons]atomic.Uint64
	bitLag                                                lagHistogram

	peers peerLog // when each other PoP was last heard (Peers)
}

// Saver is a Counts that persists own slots before they may be published
// (the durable layer, Persisted). Save also persists whatever was applied
// since the last save; on error nothing of own may be published.
type Saver interface {
	Save(own []crdt.Slot) error
}

// HotCounts is a Counts that tells which of its own slots belong to keys
// near their limit (store.Memory.Hot): the Replicator publishes those of
// each delta again on the hot subject, for other regions' PoPs that read it
// on a direct path (Config.Direct). Of the rest they hear by the stream.
type HotCounts interface {
	Hot(slots []crdt.Slot) []crdt.Slot
}

// BeaconCounts is a Counts that hears of other PoPs' presence beacons: a
// beacon that arrives after a PoP's latest delta says its link is not held
// up, and its silence is quiet, not a stall (store.Memory.Beacon).
type BeaconCounts interface {
	Beacon(pop string)
}

// UrgentNotifier is a Counts that says when a key nears its limit: the
// Replicator then flushes the delta at once, at most once per BitsInterval.
type UrgentNotifier = core.UrgentNotifier

// Run replicates until ctx is done, then publishes what is pending (for at
// most AckTimeout), stops its consumer and subscriptions and returns nil. It
// returns ErrRunning when called twice, and otherwise never fails on NATS
// trouble: it logs, retries and keeps the PoP's slots until NATS is back.
func (r *Replicator) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	subs, err := r.subscribe()
	if err != nil {
		close(r.quit)
		return err
	}
	setupCtx, stopSetup := context.WithCancel(ctx)
	consumer := make(chan jetstream.ConsumeContext, 1)
	setupDone := make(chan struct{})
	go func() {
		defer close(setupDone)
		r.setup(setupCtx, consumer)
	}()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		r.watchSources(setupCtx)
	}()

	r.loop(ctx)
	close(r.quit)

	stopSetup()
	<-setupDone
	<-watchDone
	select {
	case cc := <-consumer:
		cc.Stop()
		<-cc.Closed()
	default:
	}
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	r.js.CleanupPublisher() // the async publishes' reply subscription
	return nil
}

// loop owns the core: it ticks it at its deadlines, steps it with what the
// callbacks received, and does every Ready, until ctx is done; then it
// flushes once more and waits (at most AckTimeout) for the acknowledgements.
func (r *Replicator) loop(ctx context.Context) {
	var issued, urgent <-chan struct{}
	if n, ok := r.cfg.Bits.(BitsNotifier); ok {
		issued = n.BitsIssued()
	}
	if n, ok := r.cfg.Counts.(UrgentNotifier); ok {
		urgent = n.Urgent()
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), r.cfg.AckTimeout)
			r.with(func(c *core.Core) { c.Flush(r.now()) })
			r.do(final)
			for r.pending > 0 {
				select {
				case g := <-r.acks:
					r.acked(g)
				case <-final.Done():
					r.pending = 0
				}
			}
			cancel()
			return
		case <-timer.C:
			r.with(func(c *core.Core) { c.Tick(r.now()) })
			r.do(ctx)
		case in := <-r.in:
			if !in.skip {
				r.with(func(c *core.Core) { c.Step(r.now(), in.msg) })
				r.do(ctx)
				r.count(in)
			}
			if in.streamSeq > 0 {
				r.lastSeq.Store(in.streamSeq)
				if r.cfg.OnApplied != nil {
					r.cfg.OnApplied(in.streamSeq)
				}
				r.noteCaughtUp(in.streamSeq)
			}
		case <-issued:
			r.with(func(c *core.Core) { c.BitsIssued(r.now()) })
			r.do(ctx)
		case <-urgent:
			r.with(func(c *core.Core) { c.Urgent(r.now()) })
			r.do(ctx)
		case g := <-r.acks:
			r.acked(g)
			r.do(ctx)
		}
		var next int64
		r.with(func(c *core.Core) { next = c.NextDeadline() })
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(time.Duration(next - r.now())) // next is on the PoP's clock, not the wall clock
	}
}

// now is the PoP's clock: the wall clock plus the agreed correction.
func (r *Replicator) now() int64 { return r.cfg.Now() + r.clock.Load() }

// with runs f on the core under mu.
func (r *Replicator) with(f func(*core.Core)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r.core)
}

// Unreachable returns the other regions of the topology from which no
// presence beacon arrived within the last `within` (use a few HelloIntervals):
// the link to them is cut, or all their PoPs are down. A region not heard
// since the Replicator started counts as unreachable only once `within` has
// passed since then. Safe for concurrent use.
func (r *Replicator) Unreachable(now time.Time, within time.Duration) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.core.Unreachable(now.UnixNano(), within)
}

// Ready returns a channel that is closed once the region's stream exists and
// the Replicator consumes it: from then on, other PoPs' batches are applied.
func (r *Replicator) Ready() <-chan struct{} { return r.ready }

// CaughtUp returns a channel that is closed once the Replicator has applied
// its region's stream up to the sequence that was the stream's last when its
// consumer started: what the other PoPs published before then, while this PoP
// was down included. A PoP restarted while others admitted decides on
// their counts only from then on. It stays open while the stream cannot be
// reached (the caller bounds its wait).
func (r *Replicator) CaughtUp() <-chan struct{} { return r.caught }

// CatchUp returns the last stream sequence applied and the sequence the
// Replicator catches up to (0 until its consumer started).
func (r *Replicator) CatchUp() (applied, target uint64) {
	return r.lastSeq.Load(), r.catchUpTo.Load()
}

// noteCaughtUp closes caught once seq reaches the catch-up target. Called by
// the loop, and by setup once the target is known.
func (r *Replicator) noteCaughtUp(seq uint64) {
	if t := r.catchUpTo.Load(); t == 0 || seq < t {
		return
	}
	r.caughtOnce.Do(func() { close(r.caught) })
}

// Stats returns a copy of the Replicator's counters.
func (r *Replicator) Stats() Stats {
	s := Stats{
		ClockOffset:            time.Duration(r.clock.Load()),
		PublishedBatches:       r.published.Load(),
		PublishedSlots:         r.publishedSlots.Load(),
		PublishedBytes:         r.publishedBytes.Load(),
		PublishedSnapshots:     r.publishedSnaps.Load(),
		PublishedSnapshotSlots: r.publishedSnapSlots.Load(),
		PublishFailures:        r.publishFailures.Load(),
		RetrySlots:             int(r.retrySlots.Load()),
		RetryOverflows:         r.retryOverflows.Load(),
		AppliedBatches:         r.applied.Load(),
		AppliedSlots:           r.appliedSlots.Load(),
		AppliedSnapshots:       r.appliedSnaps.Load(),
		AppliedSnapshotSlots:   r.appliedSnapSlots.Load(),
		DirectSnapshots:        r.direct.Load(),
		DirectBatches:          r.directBatches.Load(),
		DirectSlots:            r.directSlots.Load(),
		HotBatches:             r.hotBatches.Load(),
		StalledSources:         int(r.stalledSources.Load()),
		SkippedOwn:             r.skippedOwn.Load(),
		LastAppliedSeq:         r.lastSeq.Load(),
		Lag:                    r.lag.Stats(),
		PublishedBits:          r.publishedBits.Load(),
		PublishedBitBatches:    r.publishedBitBatches.Load(),
		PublishedSnapshotBits:  r.publishedSnapBits.Load(),
		RetryBits:              int(r.retryBitsN.Load()),
		AppliedBits:            r.appliedBits.Load(),
		AppliedSnapshotBits:    r.appliedSnapBits.Load(),
		BitLag:                 r.bitLag.Stats(),
	}
	for i := range s.Dropped {
		s.Dropped[i] = r.dropped[i].Load()
	}
	for i := range s.DroppedBits {
		s.DroppedBits[i] = r.droppedBits[i].Load()
	}
	for i := range s.Rejected {
		s.Rejected[i] = r.rejected[i].Load()
	}
	return s
}
