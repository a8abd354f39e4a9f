package replication

import (
	"log/slog"

	"github.com/edgelimit/edgelimit/replication/core"
)

// RejectReason says why the receiver refused or clamped what another PoP
// sent (core.Reject): the defence in depth behind the NATS subject
// permissions. Its String is the reason label of
// edgelimit_replication_rejected_total.
type RejectReason = core.Reject

// The reject reasons (see core.Reject).
const (
	RejectReplica    = core.RejectReplica
	RejectSender     = core.RejectSender
	RejectCount      = core.RejectCount
	RejectBitEnd     = core.RejectBitEnd
	NumRejectReasons = core.NumRejects
)

// noteRejects counts the Ready's rejects and logs each reason at most once a
// second, with an example. Requires the loop.
func (r *Replicator) noteRejects(rd *core.Ready) {
	for why, n := range rd.Rejected {
		if n == 0 {
			continue
		}
		r.rejected[why].Add(uint64(n))
		r.limit.log(r.log, logReject+why, slog.LevelWarn, "replication: rejected what no PoP of the topology could have sent",
			"reason", RejectReason(why).String(), "n", n, "example", rd.RejectedWhy[why])
	}
}
