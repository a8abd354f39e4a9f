package replication

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrJetStreamFull is returned by Replicator.JetStreamFull, wrapped with the
// server's answer, while JetStream refuses this PoP's publishes for want of
// storage (insufficient resources, 10023, or the account's limit, 10002):
// nothing this PoP counts reaches the others, and it is not ready. Its slots
// wait for the next flush, so once a publish is stored again the others
// hear everything it admitted meanwhile.
var ErrJetStreamFull = errors.New("replication: JetStream refuses to store this PoP's publishes")

// JetStream's error codes for a store without room.
const (
	errCodeInsufficientResources jetstream.ErrorCode = 10023
	errCodeAccountResources      jetstream.ErrorCode = 10002
)

// noteStoreRefused records err when it is JetStream refusing a publish for
// want of storage. Requires the loop.
func (r *Replicator) noteStoreRefused(err error) {
	var api *jetstream.APIError
	if !errors.As(err, &api) || (api.ErrorCode != errCodeInsufficientResources && api.ErrorCode != errCodeAccountResources) {
		return
	}
	r.jsRefusedAt.Store(time.Now().UnixNano())
	full := fmt.Errorf("%w: %v (stream %s holds %d bytes; the server's store limit is reached: see docs/replication-security.md, \"JetStream storage\")",
		ErrJetStreamFull, api, r.stream, r.streamBytes.Load())
	if r.jsFull.Swap(&full) == nil {
		r.jsFullSince.Store(time.Now().UnixNano())
		r.log.Error("replication: JetStream refuses to store this PoP's publishes for want of storage; not ready, retrying every flush",
			"stream", r.stream, "err", api, "stream_bytes", r.streamBytes.Load())
	}
}

// noteStored records a publish JetStream stored. Requires the loop.
func (r *Replicator) noteStored() {
	if r.jsFull.Swap(nil) != nil {
		r.log.Info("replication: JetStream stores this PoP's publishes again", "stream", r.stream,
			"refused_for", time.Since(time.Unix(0, r.jsFullSince.Load())).Round(time.Millisecond).String())
	}
}

// JetStreamFull returns ErrJetStreamFull, wrapped with the server's answer,
// from the first publish JetStream refused for want of storage until one is
// stored again; nil otherwise. While refused, a PoP publishes again every
// flush (the slots it keeps) and every SnapshotInterval: a PoP with nothing
// left to publish for two snapshot intervals has nothing the others miss, and
// counts as stored again.
func (r *Replicator) JetStreamFull() error {
	p := r.jsFull.Load()
	if p == nil {
		return nil
	}
	if quiet := 2*r.cfg.SnapshotInterval + r.cfg.AckTimeout; time.Since(time.Unix(0, r.jsRefusedAt.Load())) > quiet {
		return nil
	}
	return *p
}

// StreamBytes returns the size of the region's stream at the last look (every
// few seconds) and its limit (Config.MaxBytes, 0 for none).
func (r *Replicator) StreamBytes() (bytes uint64, limit int64) {
	return r.streamBytes.Load(), r.cfg.MaxBytes
}
