package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgelimit/edgelimit/replication/core"
)

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
	// Admin, when set, is a connection allowed to administer the region's
	// stream ($JS.API.STREAM.CREATE and .UPDATE): the Replicator creates
	// the stream through it, and brings it back to StreamConfig whenever it
	// finds it otherwise. A PoP with an embedded NATS server passes an
	// in-process connection of its own (ServerConfig.Admin). Without it the
	// Replicator uses Conn, whose credential may create the stream but not
	// change it (Permissions): it creates the stream when missing, and
	// otherwise only checks it (StreamErr). The Replicator does not close it.
	Admin *nats.Conn
	// Direct holds, by region, connections to other regions' NATS servers
	// (edgelimit pop --nats-direct). On each the Replicator takes that
	// region's hot slots (HotCounts) and bits straight off their subjects,
	// all the time, beside the stream: a second path between the regions on
	// a TCP connection of its own. A TCP connection that loses a segment holds
	// everything behind it until the segment is sent again (200 ms and
	// more), and the stream sources every region over one; two connections
	// stall together only when both lose at once. What arrives both ways is
	// joined twice, which changes nothing. The Replicator does not close
	// them.
	Direct map[string]*nats.Conn
	// Counts is the PoP's counter store. When it is a Saver (the durable
	// layer, Persisted), the Replicator saves every flush's own slots before
	// it publishes them. When it is an UrgentNotifier, a key near its limit
	// flushes the delta at once (at most once per BitsInterval).
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
	// MaxBytes caps the region's stream: past it JetStream discards the
	// oldest messages, so publishes keep succeeding however much is
	// published. 0 leaves the stream unbounded in size when this PoP creates
	// it (JetStream's store limit then refuses publishes once it is
	// reached, JetStreamFull), and accepts the cap of a stream that exists.
	MaxBytes int64
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
	// UnreachableAfter is how long without a presence beacon from a region
	// before it counts as cut off; default core.DefaultUnreachableAfter.
	UnreachableAfter time.Duration
	// PartitionShare is the share of a global limit each reachable region
	// enforces while others are cut off; 0 means reachable regions / all
	// regions (region.Share).
	PartitionShare float64
	// SetGlobalShare, when set, is called with the PoP's new share of
	// global limits whenever the regions it can reach change (it scales
	// global limits: pop.Engine.SetGlobalShare). It runs on the
	// Replicator's loop and must return quickly.
	SetGlobalShare func(share float64)
	// NoClockSync keeps the PoP on its own wall clock: it does not agree on
	// a clock with the other PoPs (core.Config.NoClockSync).
	NoClockSync bool
	// MaxClockStep bounds the clock correction; default
	// core.DefaultMaxClockStep.
	MaxClockStep time.Duration
	// SetClockOffset, when set, is called with the correction of the wall
	// clock the PoPs agreed on whenever it moves (the PoP then decides at
	// the wall clock plus it: pop.Engine.SetClockOffset). It runs on the
	// Replicator's loop and must return quickly.
	SetClockOffset func(time.Duration)
	// Now is the wall clock, unix ns; nil means time.Now. Tests inject a
	// skewed one.
	Now func() int64

	// Bounds, when set, bounds what other PoPs can honestly send: counts
	// past Bounds.MaxCount and bits ending later than Bounds.MaxBit from now
	// are clamped (core.Bounds; the PoP's is pop.Engine.ReplicaBounds).
	// Messages from replicas outside Topology are rejected either way.
	Bounds core.Bounds

	// Logger receives the Replicator's logs; nil means slog.Default().
	Logger *slog.Logger
}

// New validates cfg, fills in its defaults and returns a Replicator ready to
// Run. It does no IO. The protocol's own checks (the PoP's place in the
// topology, durations) are core.New's; the NATS ones (names as subject
// tokens, stream names) are here.
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
	for region, nc := range cfg.Direct {
		switch {
		case nc == nil:
			return nil, fmt.Errorf("replication: no connection for the direct path to region %q", region)
		case region == cfg.Region:
			return nil, fmt.Errorf("replication: a direct path to this PoP's own region %q (its batches come from its own servers)", region)
		case cfg.Topology.Regions[region] == nil:
			return nil, fmt.Errorf("replication: a direct path to region %q, which is not in the topology (regions: %v)", region, cfg.Topology.Names())
		}
	}
	streams := make(map[string]string)
	for _, r := range cfg.Topology.Names() {
		if err := validToken("region", r); err != nil {
			return nil, fmt.Errorf("replication: topology: %w", err)
		}
		name := StreamName(r)
		if other, dup := streams[name]; dup {
			return nil, fmt.Errorf("replication: topology regions %q and %q both map to stream %s", other, r, name)
		}
		streams[name] = r
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
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
	if cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("replication: negative MaxBytes %d in config", cfg.MaxBytes)
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.MaxMessageBytes != 0 && cfg.MaxMessageBytes < minMessage {
		return nil, fmt.Errorf("replication: MaxMessageBytes %d is below the minimum of %d", cfg.MaxMessageBytes, minMessage)
	}
	ccfg := core.Config{
		Region: cfg.Region, POP: cfg.POP, Topology: cfg.Topology, Counts: cfg.Counts,
		FlushInterval: cfg.FlushInterval, SnapshotInterval: cfg.SnapshotInterval, HelloInterval: cfg.HelloInterval,
		BitsInterval: cfg.BitsInterval, UnreachableAfter: cfg.UnreachableAfter, PartitionShare: cfg.PartitionShare,
		Bounds:      cfg.Bounds,
		NoClockSync: cfg.NoClockSync, MaxClockStep: cfg.MaxClockStep,
	}
	if cfg.Bits != nil {
		ccfg.Bits = cfg.Bits
	}
	if cfg.Now == nil {
		cfg.Now = func() int64 { return time.Now().UnixNano() }
	}
	c, err := core.New(ccfg, cfg.Now())
	if err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	cc := c.Config()
	cfg.FlushInterval, cfg.SnapshotInterval, cfg.HelloInterval = cc.FlushInterval, cc.SnapshotInterval, cc.HelloInterval
	cfg.BitsInterval, cfg.UnreachableAfter = cc.BitsInterval, cc.UnreachableAfter
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	js, err := jetstream.New(cfg.Conn, jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("replication: JetStream context: %w", err)
	}
	var admin jetstream.JetStream
	if cfg.Admin != nil {
		if admin, err = jetstream.New(cfg.Admin); err != nil {
			return nil, fmt.Errorf("replication: JetStream context of the admin connection: %w", err)
		}
	}
	return &Replicator{
		cfg:    cfg,
		log:    log.With("region", cfg.Region, "pop", cfg.POP),
		js:     js,
		admin:  admin,
		stream: StreamName(cfg.Region),
		limit:  logLimiter{interval: time.Second},
		core:   c,
		in:     make(chan inbound, 256),
		acks:   make(chan ackGroup, 64),
		quit:   make(chan struct{}),
		ready:  make(chan struct{}),
		caught: make(chan struct{}),
	}, nil
}
