package replication

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/replication/core"
)

type cellKey struct {
	key    string
	window int64
}

// sentPart is one published message part awaiting its acknowledgement, with
// what the core must retry should it fail.
type sentPart struct {
	fut     jetstream.PubAckFuture
	retry   core.Message // the part's slots or bits, as a message of its kind
	bytes   int
	nslots  int
	nbits   int
	snapped bool // a snapshot part
}

// ackGroup is the outcome of the parts one Ready published.
type ackGroup struct {
	parts []sentPart
	errs  []error // per part; nil when acknowledged
}

// do carries out the core's Ready, if any, and advances it: save, publish,
// apply, rescale. Requires the loop.
func (r *Replicator) do(ctx context.Context) {
	r.mu.Lock()
	if !r.core.HasReady() {
		r.mu.Unlock()
		r.noteCore()
		return
	}
	rd := r.core.Ready()
	r.mu.Unlock()

	publish := true
	if s, ok := r.cfg.Counts.(Saver); ok && (rd.SaveDue || len(rd.Save) > 0) {
		if err := s.Save(rd.Save); err != nil {
			publish = false // nothing that carries own slots goes out unsaved
		}
	}
	var parts []sentPart
	var failed []core.Message
	for _, m := range rd.Messages {
		switch {
		case m.Kind == core.Hello:
			// A core publish only fills the connection's buffer; it never waits.
			_ = r.cfg.Conn.Publish(helloSubject(r.cfg.Region, r.cfg.POP), core.AppendBeacon(nil, m))
		case !publish && (m.Kind == core.Delta || m.Kind == core.Snapshot):
			failed = append(failed, m)
		default:
			p, f := r.publish(m)
			parts, failed = append(parts, p...), append(failed, f...)
		}
	}
	r.apply(rd)
	r.noteRejects(&rd)
	if rd.ClockChanged {
		r.moveClock(rd.ClockOffset)
	}
	if rd.Share != 0 {
		r.log.Warn("global limits rescaled: regions unreachable", "unreachable", rd.Unreachable, "share", rd.Share)
		if r.cfg.SetGlobalShare != nil {
			r.cfg.SetGlobalShare(rd.Share)
		}
	}
	r.mu.Lock()
	for _, m := range failed {
		r.core.Failed(m)
	}
	r.core.Advance(rd)
	r.mu.Unlock()
	for _, p := range parts {
		if p.retry.Kind == core.Delta {
			r.unacked += p.nslots
		}
	}
	r.noteCore()
	if len(parts) > 0 {
		r.pending++
		go r.waitAcks(ctx, parts)
	}
}

// noteCore copies the core's gauges into the Replicator's stats.
func (r *Replicator) noteCore() {
	r.mu.Lock()
	st := r.core.Stats()
	r.mu.Unlock()
	r.retrySlots.Store(int64(st.RetrySlots + r.unacked))
	r.retryBitsN.Store(int64(st.RetryBits))
	if old := r.retryOverflows.Swap(st.RetryOverflows); old != st.RetryOverflows {
		r.log.Warn("replication: too many slots waiting for NATS; will publish a snapshot instead")
	}
}

// apply applies the Ready's remote state to Counts and Bits and counts it.
func (r *Replicator) apply(rd core.Ready) {
	for why, n := range rd.DroppedBits {
		r.droppedBits[why].Add(uint64(n))
	}
	for _, a := range rd.Apply {
		r.peers.note(a.POP, a.Kind, r.cfg.Now())
		if a.Kind == core.Hello {
			if b, ok := r.cfg.Counts.(BeaconCounts); ok {
				b.Beacon(a.POP)
			}
			continue
		}
		if len(a.Slots) > 0 {
			r.cfg.Counts.Apply(a.Sent, a.Slots)
		}
		if len(a.Bits) == 0 {
			continue
		}
		r.cfg.Bits.ApplyBits(a.Bits)
		r.appliedBits.Add(uint64(len(a.Bits)))
		if a.Kind == core.Snapshot {
			r.appliedSnapBits.Add(uint64(len(a.Bits)))
		}
		applied := time.Unix(0, r.now())
		for _, t := range a.Issued {
			if t > 0 {
				r.bitLag.Record(applied.Sub(time.Unix(0, t)))
			}
		}
	}
}

// count counts a received message the loop handed to the core.
func (r *Replicator) count(in inbound) {
	m := in.msg
	switch {
	case m.Kind == core.Delta && in.direct:
		r.directBatches.Add(1)
		r.directSlots.Add(uint64(len(m.Slots)))
		r.lag.Record(time.Since(time.Unix(0, m.Sent)))
	case m.Kind == core.Delta:
		r.applied.Add(1)
		r.appliedSlots.Add(uint64(len(m.Slots)))
		r.lag.Record(time.Since(time.Unix(0, m.Sent)))
	case m.Kind == core.Snapshot:
		r.appliedSnaps.Add(1)
		r.appliedSnapSlots.Add(uint64(len(m.Slots)))
		if in.direct {
			r.direct.Add(1)
		}
	}
}

// nextSeq returns the Nats-Msg-Id number of the first part of m: m's own,
// or past the last part of the message before.
func (r *Replicator) nextSeq(m core.Message) uint64 {
	r.seq = max(r.seq, m.Seq)
	return r.seq
}

// publish encodes m in as many parts as its size needs and publishes them
// asynchronously. It returns the parts handed to NATS and, as messages for
// Core.Failed, what could not be.
func (r *Replicator) publish(m core.Message) (parts []sentPart, failed []core.Message) {
	switch m.Kind {
	case core.Delta:
		return r.publishDelta(m)
	case core.BitsBatch:
		return r.publishBits(m)
	case core.Snapshot:
		return r.publishSnapshot(m), nil
	}
	return nil, nil
}

func (r *Replicator) publishDelta(m core.Message) (parts []sentPart, failed []core.Message) {
	handed := 0 // how many of the slots that fit were handed to NATS
	var pubErr error
	subject := DeltaSubject(r.cfg.Region, r.cfg.POP)
	oversized, err := encodeDeltas(m.Slots, r.cfg.POP, r.cfg.Region, r.nextSeq(m), m.Sent, r.maxBytes(), func(c deltaChunk) error {
		r.seq = c.seq + 1
		fut, err := r.publishAsync(subject, c.seq, c.data)
		if err != nil {
			pubErr = err
			return err
		}
		parts = append(parts, sentPart{fut: fut, retry: core.Message{Kind: core.Delta, Slots: c.slots}, bytes: len(c.data), nslots: len(c.slots)})
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
		failed = append(failed, core.Message{Kind: core.Delta, Slots: unsentSlots(m.Slots, oversized, handed)})
	}
	r.publishHot(m)
	return parts, failed
}

// publishHot publishes, on core NATS, the slots of delta m whose keys are
// near their limit (HotCounts), for the PoPs of other regions that read
// them on a direct path. Nothing waits for it and nothing retries it: the
// stream carries the same slots. With no region but its own, there is no
// one to read them.
func (r *Replicator) publishHot(m core.Message) {
	h, ok := r.cfg.Counts.(HotCounts)
	if !ok || len(r.cfg.Topology.Regions) < 2 {
		return
	}
	hot := h.Hot(m.Slots)
	if len(hot) == 0 {
		return
	}
	subject := hotSubject(r.cfg.Region, r.cfg.POP)
	_, _ = encodeDeltas(hot, r.cfg.POP, r.cfg.Region, 0, m.Sent, r.maxBytes(), func(c deltaChunk) error {
		// A core publish only fills the connection's buffer; it never waits.
		if err := r.cfg.Conn.Publish(subject, c.data); err != nil {
			return err
		}
		r.hotBatches.Add(1)
		return nil
	})
}

func (r *Replicator) publishBits(m core.Message) (parts []sentPart, failed []core.Message) {
	chunks, oversized, err := encodeBits(m.Bits, r.cfg.POP, m.Sent, r.maxBytes())
	for _, b := range oversized {
		r.limit.log(r.log, logPublish, slog.LevelError, "replication: bit too large for a message; not replicated",
			"key_bytes", len(b.Key), "scope", b.Scope)
	}
	if err != nil {
		r.limit.log(r.log, logPublish, slog.LevelError, "replication: cannot encode mitigation bits", "err", err)
		r.publishFailures.Add(1)
		return nil, []core.Message{m}
	}
	subject := BitsSubject(r.cfg.Region, r.cfg.POP)
	seq := r.nextSeq(m)
	for i, c := range chunks {
		fut, err := r.publishAsync(subject, seq, c.data)
		seq++
		r.seq = seq
		if err != nil {
			r.limit.log(r.log, logPublish, slog.LevelWarn, "replication: publish bits failed; retrying next flush", "err", err)
			r.publishFailures.Add(1)
			for _, rest := range chunks[i:] {
				failed = append(failed, core.Message{Kind: core.BitsBatch, Bits: rest.bits})
			}
			break
		}
		parts = append(parts, sentPart{fut: fut, retry: core.Message{Kind: core.BitsBatch, Bits: c.bits}, nbits: len(c.bits)})
	}
	return parts, failed
}

// publishSnapshot publishes m's own counts and bits as Snapshot messages. A
// failure is logged; the next snapshot repeats it.
func (r *Replicator) publishSnapshot(m core.Message) []sentPart {
	msgs, nslots, _, err := encodeSnapshots(m.Slots, r.cfg.POP, r.cfg.Region, m.Sent, r.maxBytes())
	if err != nil {
		r.limit.log(r.log, logSnapshot, slog.LevelError, "replication: cannot encode snapshot", "err", err)
		return nil
	}
	nbits := make([]int, len(msgs))
	if len(m.Bits) > 0 {
		bmsgs, nb, err := encodeSnapshotBits(m.Bits, r.cfg.POP, r.cfg.Region, m.Sent, r.maxBytes())
		if err != nil {
			r.limit.log(r.log, logSnapshot, slog.LevelError, "replication: cannot encode snapshot bits", "err", err)
		} else {
			msgs = append(msgs, bmsgs...)
			nslots = append(nslots, make([]int, len(bmsgs))...)
			nbits = append(nbits, nb...)
		}
	}
	parts := make([]sentPart, 0, len(msgs))
	seq := r.nextSeq(m)
	for i, data := range msgs {
		fut, err := r.publishAsync(SnapshotSubject(r.cfg.Region, r.cfg.POP), seq, data)
		seq++
		r.seq = seq
		if err != nil {
			r.publishFailures.Add(1)
			r.limit.log(r.log, logSnapshot, slog.LevelWarn, "replication: publish snapshot failed", "err", err)
			break
		}
		parts = append(parts, sentPart{fut: fut, retry: core.Message{Kind: core.Snapshot}, nslots: nslots[i], nbits: nbits[i], snapped: true})
	}
	return parts
}

// waitAcks waits, under one AckTimeout deadline, for the acknowledgements
// of parts and hands the outcome to the loop.
func (r *Replicator) waitAcks(ctx context.Context, parts []sentPart) {
	acks := newAckWaiter(ctx, r.cfg.AckTimeout)
	defer acks.stop()
	g := ackGroup{parts: parts, errs: make([]error, len(parts))}
	for i, p := range parts {
		g.errs[i] = acks.wait(p.fut)
	}
	select {
	case r.acks <- g:
	case <-r.quit:
	}
}

// acked counts an ack group and hands what failed back to the core.
// Requires the loop.
func (r *Replicator) acked(g ackGroup) {
	r.pending--
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, p := range g.parts {
		if p.retry.Kind == core.Delta {
			r.unacked -= p.nslots
		}
		if err := g.errs[i]; err != nil {
			r.noteStoreRefused(err)
			r.publishFailures.Add(1)
			kind := p.retry.Kind
			r.limit.log(r.log, logPublish, slog.LevelWarn, MsgNotAcknowledged, "kind", kind.String(), "err", err)
			r.core.Failed(p.retry)
			continue
		}
		r.noteStored()
		switch {
		case p.snapped:
			r.publishedSnaps.Add(1)
			r.publishedSnapSlots.Add(uint64(p.nslots))
			r.publishedSnapBits.Add(uint64(p.nbits))
		case p.retry.Kind == core.BitsBatch:
			r.publishedBitBatches.Add(1)
			r.publishedBits.Add(uint64(p.nbits))
		default:
			r.published.Add(1)
			r.publishedSlots.Add(uint64(p.nslots))
			r.publishedBytes.Add(uint64(p.bytes))
		}
	}
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

// moveClock takes the correction the core agreed on with the other PoPs,
// and hands it to the PoP. A correction past clockWarn means this PoP's
// wall clock, or most others', is wrong: the operator should fix NTP.
func (r *Replicator) moveClock(offset int64) {
	old := r.clock.Swap(offset)
	if d, step := time.Duration(offset), time.Duration(offset-old); (d > clockWarn || d < -clockWarn) && (step > clockWarn/5 || step < -clockWarn/5) {
		r.log.Warn("wall clock disagrees with the other PoPs; deciding on their median clock (check NTP)",
			"correction", d, "previous", time.Duration(old))
	}
	if r.cfg.SetClockOffset != nil {
		r.cfg.SetClockOffset(time.Duration(offset))
	}
}

// clockWarn is the correction past which moveClock logs a warning.
const clockWarn = 50 * time.Millisecond
