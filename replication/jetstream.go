package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgelimit/edgelimit/crdt"
)

// Subjects and streams.
//
// A PoP publishes its delta batches on edgelimit.<region>.delta.<pop>, its
// mitigation bits on edgelimit.<region>.bits.<pop> and its snapshots on
// edgelimit.<region>.snapshot.<pop>. Each region has one stream,
// EDGELIMIT_<REGION> (the region upper-cased), that captures
// edgelimit.<region>.> and sources, from every other region's stream, that
// region's own subjects (edgelimit.<other>.>; the filter keeps a message from
// bouncing back and forth between two streams that source each other). So
// each region's stream holds every region's batches, and a PoP reads only its
// own region's stream. Presence beacons go on edgelimit._hello.<region>.<pop>,
// which no stream captures ("_" cannot start a region name).
//
// Found the hard way: without the source filters, two regions' streams that
// source each other copy every message back and forth forever.
const (
	subjectRoot    = "edgelimit"
	kindDelta      = "delta"
	kindSnapshot   = "snapshot"
	kindBits       = "bits"
	helloToken     = "_hello"
	streamPrefix   = "EDGELIMIT_"
	defaultFlush   = 100 * time.Millisecond
	defaultSnap    = 5 * time.Second
	defaultHello   = 500 * time.Millisecond
	defaultBits    = 10 * time.Millisecond
	defaultMaxAge  = 2 * time.Minute
	defaultAckWait = 2 * time.Second
	maxMessage     = 1 << 20 // bytes; NATS's default max payload
	minMessage     = 4 << 10 // bytes; the least MaxMessageBytes
	headerRoom     = 1 << 10 // bytes left in a message for NATS headers
	maxRetrySlots  = 1 << 20

	// A source of the region's stream that showed no activity for
	// sourceStale (the server sends it heartbeats every second) is stalled;
	// sources are checked every sourceCheck.
	sourceStale = 3 * time.Second
	sourceCheck = time.Second
)

// StreamName returns the name of region's stream: "EDGELIMIT_" and the
// region upper-cased.
func StreamName(region string) string { return streamPrefix + strings.ToUpper(region) }

// DeltaSubject returns the subject pop of region publishes its delta batches
// on.
func DeltaSubject(region, pop string) string {
	return subjectRoot + "." + region + "." + kindDelta + "." + pop
}

// SnapshotSubject returns the subject pop of region publishes its snapshots
// on.
func SnapshotSubject(region, pop string) string {
	return subjectRoot + "." + region + "." + kindSnapshot + "." + pop
}

// BitsSubject returns the subject pop of region publishes its mitigation
// bits (MitigationBatch messages) on.
func BitsSubject(region, pop string) string {
	return subjectRoot + "." + region + "." + kindBits + "." + pop
}

func helloSubject(region, pop string) string {
	return subjectRoot + "." + helloToken + "." + region + "." + pop
}

// ErrRunning is returned by Run when the Replicator is already running.
var ErrRunning = errors.New("replication: replicator already running")

// Config configures a Replicator. Region, POP, Conn and Counts are required;
// a zero duration takes the default given in its comment.
type Config struct {
	// Region and POP name this PoP. Both are NATS subject tokens: letters,
	// digits, '-' and '_', not starting with '_'. POP is the PoP's replica
	// name, unique across regions.
	Region, POP string
	// Topology names every region, so the region's stream can source the
	// others. An empty Topology means this region is the only one.
	Topology Topology
	// Conn is the connection to this region's NATS servers (the embedded
	// server, or an external cluster). The Replicator does not close it.
	Conn *nats.Conn
	// Counts is the PoP's counter store. Its Delta must have persisted what
	// it returns (see Counts.Delta): wrap the store with the durable layer.
	Counts Counts
	// Bits is the PoP's mitigation bit table; nil means the PoP neither
	// publishes nor applies bits (it still reads and counts bit messages).
	// Every FlushInterval the Replicator publishes Bits.BitsDelta — at once
	// when Bits is a BitsNotifier that reports an issue, see BitsInterval —
	// and it passes other PoPs' bits that concern this PoP to
	// Bits.ApplyBits: global bits from any PoP, region bits from PoPs of
	// this region only.
	Bits Bits
	// BitsInterval is the least time between two publications of bits
	// issued between flushes (Bits a BitsNotifier); bits issued meanwhile
	// wait and go together, so that a storm of issues makes at most one
	// message per interval. Default 10 ms.
	BitsInterval time.Duration

	// FlushInterval is how often the PoP publishes its delta; default 100 ms.
	FlushInterval time.Duration
	// SnapshotInterval is how often the PoP publishes its full own state for
	// anti-entropy; default 5 s.
	SnapshotInterval time.Duration
	// HelloInterval is how often the PoP sends a numbered presence beacon
	// on core NATS; default 500 ms. A PoP that hears from another PoP for
	// the first time, or misses one of its beacons (a cut link healed, the
	// other PoP restarted), publishes a snapshot at once, so the other side
	// repairs within a beacon interval or so of a heal instead of waiting
	// for SnapshotInterval or for stream sourcing to resume.
	HelloInterval time.Duration
	// AckTimeout is how long a flush waits for JetStream to acknowledge its
	// messages before it counts them as failed and retries their slots;
	// default 2 s.
	AckTimeout time.Duration
	// MaxAge is how long the region's stream keeps messages; default two
	// minutes (batches for windows older than the previous one are useless).
	MaxAge time.Duration
	// Storage is the stream's storage; default jetstream.FileStorage.
	Storage jetstream.StorageType
	// Replicas is the stream's replication factor inside the region's
	// cluster; default 1.
	Replicas int
	// Domains maps a region to its JetStream domain when regions are
	// separate domains linked by leaf nodes (see StartServer); the stream
	// then sources the other regions through their domains' API prefixes.
	// nil means all regions share one domain.
	Domains map[string]string
	// Placement places the region's stream in the NATS cluster named after
	// the region, for a gateway super-cluster that shares one domain.
	Placement bool
	// MaxMessageBytes caps the size of a published message; default the
	// server's max payload, at most 1 MiB. Larger deltas and snapshots are
	// split.
	MaxMessageBytes int

	// StartSeq is the stream position to resume after: the last sequence
	// OnApplied reported before a restart. 0 reads the whole stream.
	StartSeq uint64
	// OnApplied, when set, is called after each stream message is handled
	// (applied, skipped as own, or dropped) with its stream sequence, so the
	// durable layer can persist the position. It runs on the consumer's
	// goroutine and must return quickly.
	OnApplied func(seq uint64)
	// Logger receives the Replicator's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Replicator moves one PoP's counts to and from the other PoPs over NATS
// JetStream. Run drives it; Stats reads its counters.
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
// bits, from batches and snapshots alike, are filtered (see applyBits) and
// joined with Bits.ApplyBits.
//
// A message that does not decode, fails Validate, needs a newer
// schema, names another PoP than its subject, or has an unknown subject is
// dropped, counted in Stats and logged (at most once a second per reason).
//
// Across regions the stream is the durable path, and two direct ones over
// core NATS keep counts moving while stream sourcing is down or slow to
// resume (see StartServer, "How regions are linked"): other regions' snapshots
// are always applied straight off their subjects; numbered presence beacons
// tell a PoP when it may have missed another PoP's messages, and it then
// publishes a snapshot at once; and while the stream's source of a region is
// stalled, that region's delta batches are applied straight off their
// subjects too. Whatever arrives twice is joined twice, which changes
// nothing.
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
// Replicator is created and count up by one per message, so they grow across
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
	stream string
	limit  logLimiter

	running atomic.Bool
	ready   chan struct{} // closed once the stream consumer runs

	// Owned by the publishing loop.
	seq          uint64
	retry        map[cellKey]uint64
	lastSnapshot time.Time
	ownBits      crdt.Bits // every own bit published, until it expires
	retryBits    crdt.Bits // own bits waiting to be published (again)

	snapshotWanted atomic.Bool // a PoP reappeared; publish a snapshot soon

	helloSeq uint64 // the last beacon number sent; owned by the publishing loop
	heardMu  sync.Mutex
	heard    map[string]uint64    // PoP -> number of its last beacon
	heardAt  map[string]time.Time // region -> when a beacon of one of its PoPs last arrived
	started  time.Time

	published, publishedSlots, publishedBytes atomic.Uint64
	publishedSnaps, publishedSnapSlots        atomic.Uint64
	publishFailures, retryOverflows           atomic.Uint64
	retrySlots                                atomic.Int64
	applied, appliedSlots                     atomic.Uint64
	appliedSnaps, appliedSnapSlots, direct    atomic.Uint64
	directBatches, directSlots                atomic.Uint64
	stalledSources                            atomic.Int64
	skippedOwn, lastSeq                       atomic.Uint64
	dropped                                   [NumDropReasons]atomic.Uint64
	lag                                       lagHistogram

	publishedBits, publishedBitBatches, publishedSnapBits atomic.Uint64
	retryBitsN                                            atomic.Int64
	appliedBits, appliedSnapBits                          atomic.Uint64
	droppedBits                                           [NumBitDropReasons]atomic.Uint64
	bitLag                                                lagHistogram
}

type cellKey struct {
	key    string
	window int64
}

// New validates cfg, fills in its defaults and returns a Replicator ready to
// Run. It does no IO.
func New(cfg Config) (*Replicator, error) {
	if err := validToken("region", cfg.Region); err != nil {
		return nil, err
	}
	if err := validToken("PoP", cfg.POP); err != nil {
		return nil, err
	}
	if cfg.Conn == nil {
		return nil, errors.New("replication: config has no NATS connection")
	}
	if cfg.Counts == nil {
		return nil, errors.New("replication: config has no Counts")
	}
	if len(cfg.Topology.Regions) > 0 {
		if _, ok := cfg.Topology.Regions[cfg.Region]; !ok {
			return nil, fmt.Errorf("replication: region %q is not in the topology", cfg.Region)
		}
		if r := cfg.Topology.RegionOf(cfg.POP); r != "" && r != cfg.Region {
			return nil, fmt.Errorf("replication: PoP %q is in region %q in the topology, not %q", cfg.POP, r, cfg.Region)
		}
		streams := make(map[string]string)
		for r := range cfg.Topology.Regions {
			if err := validToken("region", r); err != nil {
				return nil, fmt.Errorf("replication: topology: %w", err)
			}
			name := StreamName(r)
			if other, dup := streams[name]; dup {
				return nil, fmt.Errorf("replication: topology regions %q and %q both map to stream %s", other, r, name)
			}
			streams[name] = r
		}
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&cfg.FlushInterval, defaultFlush},
		{&cfg.SnapshotInterval, defaultSnap},
		{&cfg.HelloInterval, defaultHello},
		{&cfg.BitsInterval, defaultBits},
		{&cfg.AckTimeout, defaultAckWait},
		{&cfg.MaxAge, defaultMaxAge},
	} {
		if *d.v < 0 {
			return nil, fmt.Errorf("replication: negative duration %v in config", *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.MaxMessageBytes != 0 && cfg.MaxMessageBytes < minMessage {
		return nil, fmt.Errorf("replication: MaxMessageBytes %d is below the minimum of %d", cfg.MaxMessageBytes, minMessage)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	js, err := jetstream.New(cfg.Conn, jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("replication: JetStream context: %w", err)
	}
	return &Replicator{
		cfg:     cfg,
		log:     log.With("region", cfg.Region, "pop", cfg.POP),
		js:      js,
		stream:  StreamName(cfg.Region),
		limit:   logLimiter{interval: time.Second},
		seq:     uint64(time.Now().UnixNano()),
		heard:   make(map[string]uint64),
		heardAt: make(map[string]time.Time),
		started: time.Now(),
		ready:   make(chan struct{}),
	}, nil
}

// validToken checks that name can be a NATS subject token and a stream name
// part: letters, digits, '-' and '_', not starting with '_'.
func validToken(what, name string) error {
	if name == "" {
		return fmt.Errorf("replication: empty %s name", what)
	}
	if name[0] == '_' {
		return fmt.Errorf("replication: %s name %q starts with '_'", what, name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("replication: %s name %q has %q; use letters, digits, '-' and '_'", what, name, c)
		}
	}
	return nil
}

// StreamConfig returns the configuration of the region's stream: its own
// subjects, MaxAge, duplicate window, and a source for every other region of
// the topology, filtered to that region's own subjects.
func (r *Replicator) StreamConfig() jetstream.StreamConfig {
	c := r.cfg
	sc := jetstream.StreamConfig{
		Name:        r.stream,
		Description: "edgelimit delta batches and snapshots of region " + c.Region + " and, sourced, of every other region",
		Subjects:    []string{subjectRoot + "." + c.Region + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      c.MaxAge,
		Duplicates:  min(c.MaxAge, 2*time.Minute),
		Storage:     c.Storage,
		Replicas:    c.Replicas,
	}
	if c.Placement {
		sc.Placement = &jetstream.Placement{Cluster: c.Region}
	}
	for _, other := range slices.Sorted(maps.Keys(c.Topology.Regions)) {
		if other == c.Region {
			continue
		}
		sc.Sources = append(sc.Sources, &jetstream.StreamSource{
			Name:          StreamName(other),
			FilterSubject: subjectRoot + "." + other + ".>",
			Domain:        c.Domains[other],
		})
	}
	return sc
}

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

// subscribe starts the core NATS subscriptions: presence beacons, and other
// regions' snapshots straight off their subjects.
func (r *Replicator) subscribe() ([]*nats.Subscription, error) {
	hello, err := r.cfg.Conn.Subscribe(subjectRoot+"."+helloToken+".*.*", r.onHello)
	if err != nil {
		return nil, fmt.Errorf("replication: subscribe to presence beacons: %w", err)
	}
	snaps, err := r.cfg.Conn.Subscribe(subjectRoot+".*."+kindSnapshot+".*", r.onDirectSnapshot)
	if err != nil {
		_ = hello.Unsubscribe()
		return nil, fmt.Errorf("replication: subscribe to snapshots: %w", err)
	}
	// Snapshots can be large and come in bursts after a heal. Past this
	// buffer the client drops some (a slow consumer); the stream path still
	// brings them.
	_ = snaps.SetPendingLimits(-1, 64<<20)
	return []*nats.Subscription{hello, snaps}, nil
}

// setup ensures the region's stream and starts the ordered consumer on it,
// retrying with backoff until it succeeds or ctx is done. It hands the
// running consumer to the consumer channel.
func (r *Replicator) setup(ctx context.Context, consumer chan<- jetstream.ConsumeContext) {
	backoff := 100 * time.Millisecond
	for {
		cc, err := r.startConsumer(ctx)
		if err == nil {
			consumer <- cc
			close(r.ready)
			return
		}
		if ctx.Err() != nil {
			return
		}
		r.limit.log(r.log, logSetup, slog.LevelWarn, "replication: cannot set up stream consumer; retrying",
			"stream", r.stream, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (r *Replicator) startConsumer(ctx context.Context) (jetstream.ConsumeContext, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := r.js.CreateOrUpdateStream(rctx, r.StreamConfig())
	if err != nil {
		return nil, fmt.Errorf("replication: create or update stream %s: %w", r.stream, err)
	}
	occ := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if start := r.cfg.StartSeq; start > 0 {
		if last := stream.CachedInfo().State.LastSeq; start > last {
			r.log.Warn("replication: resume position is past the end of the stream (was it recreated?); reading it all",
				"stream", r.stream, "start_seq", start, "last_seq", last)
		} else {
			occ.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
			occ.OptStartSeq = start + 1
		}
	}
	cons, err := r.js.OrderedConsumer(rctx, r.stream, occ)
	if err != nil {
		return nil, fmt.Errorf("replication: ordered consumer on %s: %w", r.stream, err)
	}
	cc, err := cons.Consume(r.onStreamMsg,
		jetstream.PullMaxBytes(16*maxMessage),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			r.limit.log(r.log, logSetup, slog.LevelWarn, "replication: stream consumer", "stream", r.stream, "err", err)
		}))
	if err != nil {
		return nil, fmt.Errorf("replication: consume %s: %w", r.stream, err)
	}
	r.log.Info("replication: consuming stream", "stream", r.stream, "deliver", occ.DeliverPolicy.String(), "from_seq", occ.OptStartSeq)
	return cc, nil
}

// loop is the publishing side: flushes, snapshots and presence beacons, until
// ctx is done, then a last flush.
func (r *Replicator) loop(ctx context.Context) {
	flush := time.NewTicker(r.cfg.FlushInterval)
	defer flush.Stop()
	snap := time.NewTicker(r.cfg.SnapshotInterval)
	defer snap.Stop()
	hello := time.NewTicker(r.cfg.HelloInterval)
	defer hello.Stop()
	// Bits issued between flushes go out at once, at most one batch per
	// BitsInterval: an issue within the interval arms bitsDue instead.
	var issued <-chan struct{}
	if n, ok := r.cfg.Bits.(BitsNotifier); ok {
		issued = n.BitsIssued()
	}
	bitsDue := time.NewTimer(time.Hour)
	bitsDue.Stop()
	defer bitsDue.Stop()
	var lastBits time.Time
	armed := false
	r.sayHello()
	for {
		select {
		case <-issued:
			if armed {
				continue
			}
			if wait := r.cfg.BitsInterval - time.Since(lastBits); wait > 0 {
				bitsDue.Reset(wait)
				armed = true
				continue
			}
			r.flushBits(ctx)
			lastBits = time.Now()
		case <-bitsDue.C:
			armed = false
			r.flushBits(ctx)
			lastBits = time.Now()
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.Background(), r.cfg.AckTimeout)
			r.flushBits(final)
			r.flush(final)
			cancel()
			return
		case <-flush.C:
			if r.snapshotWanted.Load() && time.Since(r.lastSnapshot) >= r.cfg.HelloInterval {
				r.snapshotWanted.Store(false)
				r.publishSnapshot(ctx)
			}
			r.flushBits(ctx)
			r.flush(ctx)
		case <-snap.C:
			r.publishSnapshot(ctx)
		case <-hello.C:
			r.sayHello()
		}
	}
}

// sayHello sends the next presence beacon: its number, a uvarint. Numbers
// start at the clock's unix nanoseconds, so a restarted PoP's first beacon
// does not follow its last one.
func (r *Replicator) sayHello() {
	if r.helloSeq == 0 {
		r.helloSeq = uint64(time.Now().UnixNano())
	}
	r.helloSeq++
	// A core publish only fills the connection's buffer; it never waits.
	_ = r.cfg.Conn.Publish(helloSubject(r.cfg.Region, r.cfg.POP), binary.AppendUvarint(nil, r.helloSeq))
}

// maxBytes is the size limit of one published message's payload.
func (r *Replicator) maxBytes() int {
	limit := r.cfg.MaxMessageBytes
	if limit == 0 {
		limit = maxMessage
		if mp := int(r.cfg.Conn.MaxPayload()); mp > 0 {
			limit = min(limit, mp)
		}
	}
	return limit - headerRoom
}

// flush publishes the PoP's delta, plus whatever failed before, and waits
// for the acknowledgements. Each message is published as soon as it is
// encoded. Requires the publishing loop's goroutine.
func (r *Replicator) flush(ctx context.Context) {
	slots := r.mergeRetry(r.cfg.Counts.Delta())
	if s, ok := r.cfg.Counts.(interface{ Save([]crdt.Slot) error }); ok {
		if err := s.Save(slots); err != nil {
			r.keep(slots)
			return
		}
	}
	if len(slots) == 0 {
		return
	}
	type pending struct {
		chunk deltaChunk
		fut   jetstream.PubAckFuture
	}
	var (
		inflight []pending
		handed   int // how many of the slots that fit were handed to NATS
		pubErr   error
	)
	subject := DeltaSubject(r.cfg.Region, r.cfg.POP)
	oversized, err := encodeDeltas(slots, r.cfg.POP, r.cfg.Region, r.seq, time.Now().UnixNano(), r.maxBytes(), func(c deltaChunk) error {
		r.seq = c.seq + 1
		fut, err := r.publishAsync(subject, c.seq, c.data)
		if err != nil {
			pubErr = err
			return err
		}
		inflight = append(inflight, pending{c, fut})
		handed += len(c.slots)
		return nil
	})
	for _, s := range oversized {
		r.limit.log(r.log, logPublish, slog.LevelError, "replication: slot too large for a message; not replicated",
			"key_bytes", len(s.Key), "window", s.Window)
	}
	if err != nil {
		// encodeDeltas has put the slots in window order and handed out
		// the first `handed` of those that fit; keep the rest.
		if pubErr == nil {
			r.limit.log(r.log, logPublish, slog.LevelError, "replication: cannot encode delta", "err", err)
		} else {
			r.limit.log(r.log, logPublish, slog.LevelWarn, "replication: publish delta failed; retrying next flush", "err", err)
		}
		r.publishFailures.Add(1)
		r.keep(unsentSlots(slots, oversized, handed))
	}
	acks := newAckWaiter(ctx, r.cfg.AckTimeout)
	defer acks.stop()
	for _, p := range inflight {
		if err := acks.wait(p.fut); err != nil {
			r.limit.log(r.log, logPublish, slog.LevelWarn, "replication: delta not acknowledged; retrying next flush",
				"seq", p.chunk.seq, "err", err)
			r.failed(p.chunk.slots)
			continue
		}
		r.published.Add(1)
		r.publishedSlots.Add(uint64(len(p.chunk.slots)))
		r.publishedBytes.Add(uint64(len(p.chunk.data)))
	}
	r.retrySlots.Store(int64(len(r.retry)))
}

// flushBits publishes the bits Bits.BitsDelta returns, joined with those
// whose publish failed before, as MitigationBatch messages stamped with the
// flush time, and waits for the acknowledgements. Bits of a message that
// fails or is not acknowledged join the next flush (latest Until wins); bits
// that expired meanwhile are not sent. Requires the publishing loop's
// goroutine.
func (r *Replicator) flushBits(ctx context.Context) {
	if r.cfg.Bits == nil {
		return
	}
	delta := r.cfg.Bits.BitsDelta()
	r.ownBits.Join(delta...)
	r.retryBits.Join(delta...)
	if r.retryBits.Len() == 0 {
		return
	}
	now := time.Now().UnixNano()
	r.retryBits.Expire(now)
	pending := r.retryBits.All()
	r.retryBits = crdt.Bits{}
	defer func() { r.retryBitsN.Store(int64(r.retryBits.Len())) }()
	if len(pending) == 0 {
		return
	}
	chunks, oversized, err := encodeBits(pending, r.cfg.POP, now, r.maxBytes())
	for _, b := range oversized {
		r.limit.log(r.log, logPublish, slog.LevelError, "replication: bit too large for a message; not replicated",
			"key_bytes", len(b.Key), "scope", b.Scope)
	}
	if err != nil {
		r.limit.log(r.log, logPublish, slog.LevelError, "replication: cannot encode mitigation bits", "err", err)
		r.publishFailures.Add(1)
		r.retryBits.Join(pending...)
		return
	}
	type sent struct {
		chunk bitsChunk
		fut   jetstream.PubAckFuture
	}
	inflight := make([]sent, 0, len(chunks))
	subject := BitsSubject(r.cfg.Region, r.cfg.POP)
	for i, c := range chunks {
		fut, err := r.publishAsync(subject, r.seq, c.data)
		r.seq++
		if err != nil {
			r.limit.log(r.log, logPublish, slog.LevelWarn, "replication: publish bits failed; retrying next flush", "err", err)
			r.publishFailures.Add(1)
			for _, rest := range chunks[i:] {
				r.retryBits.Join(rest.bits...)
			}
			break
		}
		inflight = append(inflight, sent{c, fut})
	}
	acks := newAckWaiter(ctx, r.cfg.AckTimeout)
	defer acks.stop()
	for _, p := range inflight {
		if err := acks.wait(p.fut); err != nil {
			r.limit.log(r.log, logPublish, slog.LevelWarn, "replication: bits not acknowledged; retrying next flush", "err", err)
			r.publishFailures.Add(1)
			r.retryBits.Join(p.chunk.bits...)
			continue
		}
		r.publishedBitBatches.Add(1)
		r.publishedBits.Add(uint64(len(p.chunk.bits)))
	}
}

// applyBits joins, with Bits.ApplyBits, the bits that concern this PoP of a
// message from a PoP of region: global bits from any region, region bits
// from this region only. Bits of another scope, region bits of another
// region, bits whose origin is this PoP and bits already expired are not
// applied but counted in DroppedBits. fromBatch says the bits came in a
// MitigationBatch, whose issue times feed BitLag. It is a no-op without
// Config.Bits.
func (r *Replicator) applyBits(region string, in []wireBit, fromBatch bool) {
	if r.cfg.Bits == nil || len(in) == 0 {
		return
	}
	now := time.Now().UnixNano()
	keep := make([]crdt.Bit, 0, len(in))
	var issued []int64
	for _, w := range in {
		reason := BitDropReason(-1)
		switch {
		case w.scope != scopeGlobal && w.scope != scopeRegion:
			reason = BitDropScope
		case w.scope == scopeRegion && region != r.cfg.Region:
			reason = BitDropRegion
		case w.bit.Origin == r.cfg.POP:
			reason = BitDropOwn
		case w.bit.Until <= now:
			reason = BitDropExpired
		}
		if reason >= 0 {
			r.droppedBits[reason].Add(1)
			continue
		}
		keep = append(keep, w.bit)
		if fromBatch && w.issued > 0 {
			issued = append(issued, w.issued)
		}
	}
	if len(keep) == 0 {
		return
	}
	r.cfg.Bits.ApplyBits(keep)
	r.appliedBits.Add(uint64(len(keep)))
	if !fromBatch {
		r.appliedSnapBits.Add(uint64(len(keep)))
	}
	applied := time.Now()
	for _, t := range issued {
		r.bitLag.Record(applied.Sub(time.Unix(0, t)))
	}
}

// unsentSlots returns the slots of a flush that were not handed to NATS: all
// but the oversized ones, minus the first `sent` of those.
func unsentSlots(slots, oversized []crdt.Slot, sent int) []crdt.Slot {
	if len(oversized) == 0 {
		return slots[sent:]
	}
	skip := make(map[cellKey]bool, len(oversized))
	for _, s := range oversized {
		skip[cellKey{s.Key, s.Window}] = true
	}
	var out []crdt.Slot
	for _, s := range slots {
		if !skip[cellKey{s.Key, s.Window}] {
			out = append(out, s)
		}
	}
	return out[min(sent, len(out)):]
}

func (r *Replicator) publishAsync(subject string, seq uint64, data []byte) (jetstream.PubAckFuture, error) {
	msg := nats.NewMsg(subject)
	msg.Data = data
	return r.js.PublishMsgAsync(msg,
		jetstream.WithMsgID(r.cfg.POP+"-"+strconv.FormatUint(seq, 10)),
		jetstream.WithExpectStream(r.stream))
}

// failed keeps the slots of a message that was not acknowledged, for the
// next flush. Requires the publishing loop's goroutine.
func (r *Replicator) failed(slots []crdt.Slot) {
	r.publishFailures.Add(1)
	r.keep(slots)
}

// keep adds slots to the retry set, keeping the larger count per (key,
// window). When the set outgrows maxRetrySlots it is dropped and a snapshot
// of the PoP's own counts (which the store keeps pruned) replaces it.
func (r *Replicator) keep(slots []crdt.Slot) {
	if r.retry == nil {
		r.retry = make(map[cellKey]uint64)
	}
	for _, s := range slots {
		k := cellKey{s.Key, s.Window}
		r.retry[k] = max(r.retry[k], s.Count)
	}
	if len(r.retry) > maxRetrySlots {
		r.log.Warn("replication: too many slots waiting for NATS; will publish a snapshot instead", "slots", len(r.retry))
		r.retry = nil
		r.retryOverflows.Add(1)
		r.snapshotWanted.Store(true)
	}
}

// mergeRetry joins the retry set into slots (per-slot maximum) and empties
// it. Requires the publishing loop's goroutine.
func (r *Replicator) mergeRetry(slots []crdt.Slot) []crdt.Slot {
	if len(r.retry) == 0 {
		return slots
	}
	for i, s := range slots {
		k := cellKey{s.Key, s.Window}
		if n, ok := r.retry[k]; ok {
			slots[i].Count = max(s.Count, n)
			delete(r.retry, k)
		}
	}
	for k, n := range r.retry {
		slots = append(slots, crdt.Slot{Key: k.key, Window: k.window, Replica: r.cfg.POP, Count: n})
	}
	r.retry = nil
	return slots
}

// publishSnapshot publishes the PoP's own counts as Snapshot messages and
// waits for their acknowledgements. A failure is logged; the next snapshot
// repeats it. Requires the publishing loop's goroutine.
func (r *Replicator) publishSnapshot(ctx context.Context) {
	r.lastSnapshot = time.Now()
	now := r.lastSnapshot.UnixNano()
	own := r.cfg.Counts.Own()
	r.ownBits.Expire(now)
	bits := r.ownBits.Active(now)
	if len(own) == 0 && len(bits) == 0 {
		return
	}
	msgs, nslots, _, err := encodeSnapshots(own, r.cfg.POP, r.cfg.Region, now, r.maxBytes())
	if err != nil {
		r.limit.log(r.log, logSnapshot, slog.LevelError, "replication: cannot encode snapshot", "err", err)
		return
	}
	nbits := make([]int, len(msgs))
	if len(bits) > 0 {
		bmsgs, nb, err := encodeSnapshotBits(bits, r.cfg.POP, r.cfg.Region, now, r.maxBytes())
		if err != nil {
			r.limit.log(r.log, logSnapshot, slog.LevelError, "replication: cannot encode snapshot bits", "err", err)
		} else {
			msgs = append(msgs, bmsgs...)
			nslots = append(nslots, make([]int, len(bmsgs))...)
			nbits = append(nbits, nb...)
		}
	}
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, data := range msgs {
		fut, err := r.publishAsync(SnapshotSubject(r.cfg.Region, r.cfg.POP), r.seq, data)
		r.seq++
		if err != nil {
			r.publishFailures.Add(1)
			r.limit.log(r.log, logSnapshot, slog.LevelWarn, "replication: publish snapshot failed", "err", err)
			break
		}
		futs = append(futs, fut)
	}
	acks := newAckWaiter(ctx, r.cfg.AckTimeout)
	defer acks.stop()
	for i, fut := range futs {
		if err := acks.wait(fut); err != nil {
			r.publishFailures.Add(1)
			r.limit.log(r.log, logSnapshot, slog.LevelWarn, "replication: snapshot not acknowledged", "err", err)
			continue
		}
		r.publishedSnaps.Add(1)
		r.publishedSnapSlots.Add(uint64(nslots[i]))
		r.publishedSnapBits.Add(uint64(nbits[i]))
	}
}

// ackWaiter waits for the acknowledgements of a group of asynchronous
// publishes, all under one deadline.
type ackWaiter struct {
	ctx     context.Context
	timeout time.Duration
	timer   *time.Timer
	expired bool
}

func newAckWaiter(ctx context.Context, timeout time.Duration) *ackWaiter {
	return &ackWaiter{ctx: ctx, timeout: timeout, timer: time.NewTimer(timeout)}
}

func (a *ackWaiter) stop() { a.timer.Stop() }

// wait returns nil once fut is acknowledged, or the publish error, or an
// error when the deadline passed or ctx is done first. After the deadline it
// no longer waits, but still takes an acknowledgement that has arrived.
func (a *ackWaiter) wait(fut jetstream.PubAckFuture) error {
	if a.expired {
		select {
		case <-fut.Ok():
			return nil
		case err := <-fut.Err():
			return err
		default:
			return fmt.Errorf("no acknowledgement within %v", a.timeout)
		}
	}
	select {
	case <-fut.Ok():
		return nil
	case err := <-fut.Err():
		return err
	case <-a.timer.C:
		a.expired = true
		return a.wait(fut)
	case <-a.ctx.Done():
		a.expired = true
		return a.wait(fut)
	}
}

// onHello notes a presence beacon, and asks for a snapshot when the PoP
// that sent it is new or a beacon of it went missing: core NATS loses
// messages only when a connection or link drops, and then this PoP may have
// missed that PoP's batches, and that PoP this one's.
func (r *Replicator) onHello(m *nats.Msg) {
	tok := strings.Split(m.Subject, ".")
	seq, n := binary.Uvarint(m.Data)
	if len(tok) != 4 || tok[3] == r.cfg.POP || n <= 0 {
		return
	}
	pop := tok[3]
	r.heardMu.Lock()
	last, known := r.heard[pop]
	r.heard[pop] = seq
	r.heardAt[tok[2]] = time.Now()
	r.heardMu.Unlock()
	if !known || seq != last+1 {
		r.log.Debug("replication: PoP new or beacons missed; will publish a snapshot",
			"from_region", tok[2], "from_pop", pop, "missed", seq-last-1)
		r.snapshotWanted.Store(true)
	}
}

// Unreachable returns the other regions of the topology from which no
// presence beacon arrived within the last `within` (use a few HelloIntervals):
// the link to them is cut, or all their PoPs are down. A region not heard
// since the Replicator started counts as unreachable only once `within` has
// passed since then. Safe for concurrent use.
func (r *Replicator) Unreachable(now time.Time, within time.Duration) []string {
	r.heardMu.Lock()
	defer r.heardMu.Unlock()
	var out []string
	for region := range r.cfg.Topology.Regions {
		if region == r.cfg.Region {
			continue
		}
		last, ok := r.heardAt[region]
		if !ok {
			last = r.started
		}
		if now.Sub(last) > within {
			out = append(out, region)
		}
	}
	sort.Strings(out)
	return out
}

// watchSources checks the sources of the region's stream every sourceCheck.
// While the source of another region is stalled (no activity, heartbeats
// included, for sourceStale, or an error), it takes that region's delta
// batches straight off their subjects, so counting across regions goes on
// while the server retries the source, which after a long cut can take a
// minute and more (see StartServer, "How regions are linked"). Once the source
// is healthy again it leaves the batches to the stream. Batches that arrive
// both ways are joined twice, which changes nothing.
func (r *Replicator) watchSources(ctx context.Context) {
	var others []string
	for region := range r.cfg.Topology.Regions {
		if region != r.cfg.Region {
			others = append(others, region)
		}
	}
	if len(others) == 0 {
		return
	}
	direct := make(map[string][]*nats.Subscription)
	unsubscribe := func(subs []*nats.Subscription) {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}
	defer func() {
		for _, subs := range direct {
			unsubscribe(subs)
		}
	}()
	tick := time.NewTicker(sourceCheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, sourceCheck)
		stream, err := r.js.Stream(rctx, r.stream)
		cancel()
		if err != nil {
			continue // no stream yet, or our own server is unreachable: nothing to learn
		}
		healthy := make(map[string]bool)
		for _, si := range stream.CachedInfo().Sources {
			healthy[si.Name] = si.Error == nil && si.Active >= 0 && si.Active < sourceStale
		}
		for _, region := range others {
			subs := direct[region]
			switch ok := healthy[StreamName(region)]; {
			case !ok && subs == nil:
				sub, err := r.cfg.Conn.Subscribe(subjectRoot+"."+region+"."+kindDelta+".*", r.onDirectDelta)
				if err != nil {
					r.limit.log(r.log, logSetup, slog.LevelWarn, "replication: cannot subscribe to a region's batches", "from_region", region, "err", err)
					continue
				}
				_ = sub.SetPendingLimits(-1, 64<<20)
				subs = []*nats.Subscription{sub}
				if r.cfg.Bits != nil {
					bsub, err := r.cfg.Conn.Subscribe(subjectRoot+"."+region+"."+kindBits+".*", r.onDirectBits)
					if err != nil {
						unsubscribe(subs)
						r.limit.log(r.log, logSetup, slog.LevelWarn, "replication: cannot subscribe to a region's bits", "from_region", region, "err", err)
						continue
					}
					subs = append(subs, bsub)
				}
				direct[region] = subs
				r.log.Info("replication: stream sourcing from region stalled; taking its batches directly", "from_region", region)
			case ok && subs != nil:
				unsubscribe(subs)
				delete(direct, region)
				r.log.Info("replication: stream sourcing from region resumed", "from_region", region)
			}
		}
		r.stalledSources.Store(int64(len(direct)))
	}
}

// onDirectDelta applies a delta batch of another region taken straight off
// its subject while stream sourcing from that region is stalled. Messages it
// cannot apply are left to the stream path, which drops and counts them.
func (r *Replicator) onDirectDelta(m *nats.Msg) {
	region, kind, pop, ok := parseSubject(m.Subject)
	if !ok || kind != kindDelta || region == r.cfg.Region || pop == r.cfg.POP {
		return
	}
	slots, sent, err := decodeDelta(m.Data, region, pop)
	if err != nil {
		return
	}
	r.cfg.Counts.Apply(sent, slots)
	r.directBatches.Add(1)
	r.directSlots.Add(uint64(len(slots)))
	r.lag.Record(time.Since(time.Unix(0, sent)))
}

// onDirectBits applies the bits of a MitigationBatch of another region taken
// straight off its subject while stream sourcing from that region is
// stalled. Messages it cannot decode are left to the stream path, which drops
// and counts them.
func (r *Replicator) onDirectBits(m *nats.Msg) {
	region, kind, pop, ok := parseSubject(m.Subject)
	if !ok || kind != kindBits || region == r.cfg.Region || pop == r.cfg.POP {
		return
	}
	bits, err := decodeBits(m.Data, region, pop)
	if err != nil {
		return
	}
	r.applyBits(region, bits, true)
}

// onDirectSnapshot applies a snapshot of another region straight off its
// subject, without waiting for the stream to source it. Messages of this
// region, and any it cannot apply, are left to the stream path, which applies
// or drops and counts them.
func (r *Replicator) onDirectSnapshot(m *nats.Msg) {
	region, kind, pop, ok := parseSubject(m.Subject)
	if !ok || kind != kindSnapshot || region == r.cfg.Region || pop == r.cfg.POP {
		return
	}
	if r.applySnapshot(m.Data, region, pop) == nil {
		r.direct.Add(1)
	}
}

// applySnapshot decodes the snapshot pop of region published and applies its
// counts and bits.
func (r *Replicator) applySnapshot(data []byte, region, pop string) error {
	slots, bits, err := decodeSnapshotBits(data, region, pop, r.cfg.POP)
	if err != nil {
		return err
	}
	if len(slots) > 0 {
		r.cfg.Counts.Apply(0, slots)
	}
	r.applyBits(region, bits, false)
	r.appliedSnaps.Add(1)
	r.appliedSnapSlots.Add(uint64(len(slots)))
	return nil
}

// parseSubject splits edgelimit.<region>.<kind>.<pop>.
func parseSubject(subject string) (region, kind, pop string, ok bool) {
	rest, ok := strings.CutPrefix(subject, subjectRoot+".")
	if !ok {
		return "", "", "", false
	}
	region, rest, ok1 := strings.Cut(rest, ".")
	kind, pop, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || region == "" || kind == "" || pop == "" || strings.Contains(pop, ".") {
		return "", "", "", false
	}
	return region, kind, pop, true
}

// onStreamMsg handles one message of the region's stream.
func (r *Replicator) onStreamMsg(m jetstream.Msg) {
	r.receive(m.Subject(), m.Data())
	if md, err := m.Metadata(); err == nil {
		seq := md.Sequence.Stream
		r.lastSeq.Store(seq)
		if r.cfg.OnApplied != nil {
			r.cfg.OnApplied(seq)
		}
	}
}

// receive applies, skips or drops one stream message.
func (r *Replicator) receive(subject string, data []byte) {
	region, kind, pop, ok := parseSubject(subject)
	if !ok || (kind != kindDelta && kind != kindSnapshot && kind != kindBits) {
		r.drop(&decodeError{DropSubject, fmt.Errorf("unknown subject %q", subject)}, subject)
		return
	}
	if pop == r.cfg.POP {
		r.skippedOwn.Add(1)
		return
	}
	switch kind {
	case kindDelta:
		slots, sent, err := decodeDelta(data, region, pop)
		if err != nil {
			r.drop(err, subject)
			return
		}
		r.cfg.Counts.Apply(sent, slots)
		r.applied.Add(1)
		r.appliedSlots.Add(uint64(len(slots)))
		r.lag.Record(time.Since(time.Unix(0, sent)))
	case kindSnapshot:
		if err := r.applySnapshot(data, region, pop); err != nil {
			r.drop(err, subject)
			return
		}
	case kindBits:
		bits, err := decodeBits(data, region, pop)
		if err != nil {
			r.drop(err, subject)
			return
		}
		r.applyBits(region, bits, true)
	}
}

func (r *Replicator) drop(err error, subject string) {
	reason := DropDecode
	var de *decodeError
	if errors.As(err, &de) {
		reason = de.reason
	}
	r.dropped[reason].Add(1)
	r.limit.log(r.log, int(reason), slog.LevelWarn, "replication: dropped a stream message",
		"reason", reason.String(), "subject", subject, "err", err)
}

// Ready returns a channel that is closed once the region's stream exists and
// the Replicator consumes it: from then on, other PoPs' batches are applied.
func (r *Replicator) Ready() <-chan struct{} { return r.ready }

// Stats returns a copy of the Replicator's counters.
func (r *Replicator) Stats() Stats {
	s := Stats{
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
	return s
}
