package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
		MaxBytes:    c.MaxBytes,
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
	subs := []*nats.Subscription{hello, snaps}
	for _, region := range slices.Sorted(maps.Keys(r.cfg.Direct)) {
		more, err := r.subscribeRegion(r.cfg.Direct[region], region, true)
		if err != nil {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return nil, fmt.Errorf("%w, on the direct path (Config.Direct)", err)
		}
		subs = append(subs, more...)
	}
	return subs, nil
}

// subscribeRegion subscribes, on nc, to region's delta batches — whole, or
// only their hot slots (HotCounts) — and, when this PoP applies bits, to its
// bits, straight off their subjects.
func (r *Replicator) subscribeRegion(nc *nats.Conn, region string, hotOnly bool) ([]*nats.Subscription, error) {
	subject, handler := subjectRoot+"."+region+"."+kindDelta+".*", r.onDirectDelta
	if hotOnly {
		subject, handler = subjectRoot+"."+hotToken+"."+region+".*", r.onHot
	}
	sub, err := nc.Subscribe(subject, handler)
	if err != nil {
		return nil, fmt.Errorf("replication: subscribe to region %s's batches: %w", region, err)
	}
	// Batches come in bursts after a heal; past this buffer the client
	// drops some (a slow consumer), which the stream still brings.
	_ = sub.SetPendingLimits(-1, 64<<20)
	subs := []*nats.Subscription{sub}
	if r.cfg.Bits != nil {
		bsub, err := nc.Subscribe(subjectRoot+"."+region+"."+kindBits+".*", r.onDirectBits)
		if err != nil {
			_ = sub.Unsubscribe()
			return nil, fmt.Errorf("replication: subscribe to region %s's bits: %w", region, err)
		}
		subs = append(subs, bsub)
	}
	return subs, nil
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
	stream, err := r.ensureStream(rctx)
	if err != nil {
		return nil, err
	}
	occ := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	last := stream.CachedInfo().State.LastSeq
	if start := r.cfg.StartSeq; start > 0 {
		if start > last {
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
	r.log.Info("replication: consuming stream", "stream", r.stream, "deliver", occ.DeliverPolicy.String(), "from_seq", occ.OptStartSeq,
		"catch_up_to_seq", last)
	r.setCatchUp(last, max(occ.OptStartSeq, 1))
	return cc, nil
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
		info := stream.CachedInfo()
		r.streamBytes.Store(info.State.Bytes)
		if r.checkStream(info.Config) != nil && r.admin != nil {
			r.repairStream(ctx)
		}
		healthy := make(map[string]bool)
		for _, si := range stream.CachedInfo().Sources {
			healthy[si.Name] = si.Error == nil && si.Active >= 0 && si.Active < sourceStale
		}
		for _, region := range others {
			subs := direct[region]
			switch ok := healthy[StreamName(region)]; {
			case !ok && subs == nil:
				subs, err := r.subscribeRegion(r.cfg.Conn, region, false)
				if err != nil {
					r.limit.log(r.log, logSetup, slog.LevelWarn, "replication: cannot subscribe to a region's batches", "from_region", region, "err", err)
					continue
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

// ensureStream makes the region's stream exist as StreamConfig says, as far
// as this PoP's credentials allow, and checks it. With Config.Admin it
// creates or updates the stream through that connection; without, it only
// creates a missing one (a PoP's own credential may create its region's
// stream, never change one: Permissions), and an existing stream stays as it
// is. Either way it then reads the stream's configuration back and returns
// ErrStreamConfig, with the differences, when it is not as expected: the
// caller does not consume such a stream.
func (r *Replicator) ensureStream(ctx context.Context) (jetstream.Stream, error) {
	want := r.StreamConfig()
	if r.admin != nil {
		if _, err := r.admin.CreateOrUpdateStream(ctx, want); err != nil {
			return nil, fmt.Errorf("replication: create or update stream %s (admin connection): %w", r.stream, err)
		}
	}
	stream, err := r.js.Stream(ctx, r.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) && r.admin == nil {
		// A create of an existing stream is refused (another configuration)
		// or answered by a check of the limits it would reserve: look first.
		if _, err = r.js.CreateStream(ctx, want); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("replication: create stream %s: %w", r.stream, err)
		}
		stream, err = r.js.Stream(ctx, r.stream)
	}
	if err != nil {
		return nil, fmt.Errorf("replication: stream %s: %w", r.stream, err)
	}
	if err := r.checkStream(stream.CachedInfo().Config); err != nil {
		return nil, err
	}
	return stream, nil
}

// checkStream compares the stream's configuration got with StreamConfig,
// keeps the outcome for StreamErr, and logs when it changes.
func (r *Replicator) checkStream(got jetstream.StreamConfig) error {
	diff := streamDiff(r.StreamConfig(), got)
	if len(diff) == 0 {
		if r.streamErr.Swap(nil) != nil {
			r.log.Info("replication: the region's stream is configured as expected again", "stream", r.stream)
		}
		return nil
	}
	err := fmt.Errorf("%w: %s: %s", ErrStreamConfig, r.stream, strings.Join(diff, "; "))
	if old := r.streamErr.Swap(&err); old == nil || (*old).Error() != err.Error() {
		fix := "restore it with an operator credential (edgelimit pop --nats-admin-nkey, see docs/replication-security.md)"
		if r.admin != nil {
			fix = "restoring it through the admin connection"
		}
		r.log.Error("replication: the region's stream is not configured as this PoP expects; not ready until it is",
			"stream", r.stream, "differs", strings.Join(diff, "; "), "fix", fix)
	}
	return err
}

// repairStream brings the stream back to StreamConfig through the admin
// connection.
func (r *Replicator) repairStream(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, sourceCheck)
	defer cancel()
	if _, err := r.admin.UpdateStream(rctx, r.StreamConfig()); err != nil {
		r.limit.log(r.log, logSetup, slog.LevelWarn, "replication: cannot restore the region's stream", "stream", r.stream, "err", err)
	}
}

// StreamErr returns ErrStreamConfig, wrapped with what differs, while the
// region's stream is not configured as StreamConfig says (checked when the
// consumer starts and every few seconds after), or nil. A PoP is not ready
// meanwhile.
func (r *Replicator) StreamErr() error {
	if p := r.streamErr.Load(); p != nil {
		return *p
	}
	return nil
}

// setCatchUp sets what CaughtUp waits for: the stream's last sequence when
// the consumer started, last, read from sequence from on. With nothing to
// read (last < from, an empty stream included) the Replicator is caught up
// at once. Only the first call counts: the target is the stream's end when
// this PoP started.
func (r *Replicator) setCatchUp(last, from uint64) {
	if last < from {
		r.caughtOnce.Do(func() { close(r.caught) })
		return
	}
	if r.catchUpTo.CompareAndSwap(0, last) {
		r.noteCaughtUp(r.lastSeq.Load())
	}
}
