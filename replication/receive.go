package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/replication/core"
)

// inbound is a received message on its way from a NATS callback to the loop.
type inbound struct {
	msg       core.Message
	direct    bool   // taken straight off a subject, not from the stream
	streamSeq uint64 // the stream position to report once handled; 0 off the stream
	skip      bool   // skipped or dropped: only its position is reported
}

// post hands in to the loop; it gives up once the loop is gone.
func (r *Replicator) post(in inbound) {
	select {
	case r.in <- in:
	case <-r.quit:
	}
}

// onHello passes a presence beacon to the core, which notes its region as
// reachable, and asks for a snapshot when the PoP that sent it is new or a
// beacon of it went missing: core NATS loses messages only when a
// connection or link drops, and then this PoP may have missed that PoP's
// batches, and that PoP this one's.
func (r *Replicator) onHello(m *nats.Msg) {
	tok := strings.Split(m.Subject, ".")
	seq, sent, echo, ok, _ := core.ParseBeacon(m.Data)
	if len(tok) != 4 || tok[3] == r.cfg.POP || !ok {
		return
	}
	// A beacon whose clock part does not parse still says its sender is
	// there; ParseBeacon then returns no timestamps.
	r.post(inbound{msg: core.Message{Kind: core.Hello, Region: tok[2], POP: tok[3], Seq: seq, Sent: sent, Echo: echo}})
}

// onDirectDelta takes a delta batch of another region straight off its
// subject: on a direct connection to that region (Config.Direct), and on
// this region's connection while stream sourcing from that region is
// stalled. Messages it cannot decode are left to the stream path, which
// drops and counts them.
func (r *Replicator) onDirectDelta(m *nats.Msg) {
	region, kind, pop, ok := parseSubject(m.Subject)
	if !ok || kind != kindDelta || region == r.cfg.Region || pop == r.cfg.POP {
		return
	}
	slots, sent, err := decodeDelta(m.Data, region, pop)
	if err != nil {
		return
	}
	r.post(inbound{msg: core.Message{Kind: core.Delta, Region: region, POP: pop, Sent: sent, Slots: slots}, direct: true})
}

// onHot takes another region's hot slots (HotCounts) off their subject on a
// direct path; they decode as a delta batch of the PoP the subject names.
func (r *Replicator) onHot(m *nats.Msg) {
	tok := strings.Split(m.Subject, ".")
	if len(tok) != 4 || tok[2] == r.cfg.Region || tok[3] == r.cfg.POP {
		return
	}
	slots, sent, err := decodeDelta(m.Data, tok[2], tok[3])
	if err != nil {
		r.drop(err, m.Subject)
		return
	}
	r.post(inbound{msg: core.Message{Kind: core.Delta, Region: tok[2], POP: tok[3], Sent: sent, Slots: slots}, direct: true})
}

// onDirectBits takes a MitigationBatch of another region straight off its
// subject, as onDirectDelta takes a delta batch. Messages it cannot decode
// are left to the stream path, which drops and counts them.
func (r *Replicator) onDirectBits(m *nats.Msg) {
	region, kind, pop, ok := parseSubject(m.Subject)
	if !ok || kind != kindBits || region == r.cfg.Region || pop == r.cfg.POP {
		return
	}
	bits, err := decodeBits(m.Data, region, pop)
	if err != nil {
		return
	}
	r.post(inbound{msg: bitsMessage(region, pop, bits), direct: true})
}

// onDirectSnapshot takes a snapshot of another region straight off its
// subject, without waiting for the stream to source it. Messages of this
// region, and any it cannot decode, are left to the stream path, which
// applies or drops and counts them.
func (r *Replicator) onDirectSnapshot(m *nats.Msg) {
	region, kind, pop, ok := parseSubject(m.Subject)
	if !ok || kind != kindSnapshot || region == r.cfg.Region || pop == r.cfg.POP {
		return
	}
	msg, err := r.decodeSnapshot(m.Data, region, pop)
	if err != nil {
		return
	}
	r.post(inbound{msg: msg, direct: true})
}

// decodeSnapshot decodes the snapshot pop of region published.
func (r *Replicator) decodeSnapshot(data []byte, region, pop string) (core.Message, error) {
	slots, bits, err := decodeSnapshotBits(data, region, pop, r.cfg.POP)
	if err != nil {
		return core.Message{}, err
	}
	m := bitsMessage(region, pop, bits)
	m.Kind, m.Slots, m.Issued = core.Snapshot, slots, nil
	return m, nil
}

// bitsMessage is the core message of received wire bits.
func bitsMessage(region, pop string, in []wireBit) core.Message {
	m := core.Message{Kind: core.BitsBatch, Region: region, POP: pop}
	if len(in) == 0 {
		return m
	}
	m.Bits, m.Issued = make([]crdt.Bit, len(in)), make([]int64, len(in))
	for i, w := range in {
		m.Bits[i], m.Issued[i] = w.bit, w.issued // an unknown scope past 255 is 255: still unknown
	}
	return m
}

// onStreamMsg handles one message of the region's stream: it decodes it
// and hands it to the loop, which applies it and then reports its position.
func (r *Replicator) onStreamMsg(m jetstream.Msg) {
	in, ok := r.receive(m.Subject(), m.Data())
	if !ok {
		in = inbound{skip: true}
	}
	if md, err := m.Metadata(); err == nil {
		in.streamSeq = md.Sequence.Stream
	}
	r.post(in)
}

// receive decodes one stream message, or skips or drops it (ok false).
func (r *Replicator) receive(subject string, data []byte) (in inbound, ok bool) {
	region, kind, pop, ok := parseSubject(subject)
	if !ok || (kind != kindDelta && kind != kindSnapshot && kind != kindBits) {
		r.drop(&decodeError{DropSubject, fmt.Errorf("unknown subject %q", subject)}, subject)
		return in, false
	}
	if pop == r.cfg.POP {
		r.skippedOwn.Add(1)
		r.restoreOwn(kind, region, pop, data) // receive_own.go
		return in, false
	}
	switch kind {
	case kindDelta:
		slots, sent, err := decodeDelta(data, region, pop)
		if err != nil {
			r.drop(err, subject)
			return in, false
		}
		in.msg = core.Message{Kind: core.Delta, Region: region, POP: pop, Sent: sent, Slots: slots}
	case kindSnapshot:
		m, err := r.decodeSnapshot(data, region, pop)
		if err != nil {
			r.drop(err, subject)
			return in, false
		}
		in.msg = m
	case kindBits:
		bits, err := decodeBits(data, region, pop)
		if err != nil {
			r.drop(err, subject)
			return in, false
		}
		in.msg = bitsMessage(region, pop, bits)
	}
	return in, true
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
