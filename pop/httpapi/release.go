package httpapi

import (
	"fmt"
	"net/http"

	"github.com/edgelimit/edgelimit/pop"
	"github.com/edgelimit/edgelimit/pop/limit"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// MaxRelease caps the lease ids of one release request.
const MaxRelease = 64

// releaseRequest is POST /v1/release's body: one lease id, or several.
type releaseRequest struct {
	LeaseID  *string  `json:"lease_id"`
	LeaseIDs []string `json:"lease_ids"`
}

// handleRelease frees concurrency leases that /v1/check handed out:
//
//	{"lease_id":"…"} or {"lease_ids":["…",…]}
//	→ 200 {"results":[{"lease_id":"…","released":true,"state":"released"},…]}
//
// It is idempotent: a lease released before, expired, or unknown is a 200
// with released false and state "unknown" or "expired" (a lease found past
// its TTL, whose slot was already free). A malformed id is a 400 naming it
// (lease_id or lease_ids[i]) and releases nothing; a lease store that
// fails is a 503, after the ids before it were released — retrying is safe.
func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "", `use POST with {"lease_id":"..."} or {"lease_ids":[...]}`)
		return
	}
	st := s.getState()
	defer s.putState(st)
	if err := s.readBody(w, r, st, s.cfg.MaxBody); err != nil {
		s.bodyFailed(w, "release", err)
		return
	}
	var req releaseRequest
	if id, ok := oneLeaseID(st.body); ok {
		req.LeaseID = &id
	} else if err := s.decodeSlow(st, &req); err != nil {
		s.bodyFailed(w, "release", err)
		return
	}
	ids, fields := req.LeaseIDs, make([]string, 0, len(req.LeaseIDs)+1)
	switch {
	case req.LeaseID != nil && req.LeaseIDs != nil:
		s.badRequest(w, "release", "lease_ids", "give lease_id or lease_ids, not both")
		return
	case req.LeaseID != nil:
		ids = []string{*req.LeaseID}
		fields = append(fields, "lease_id")
	case len(ids) == 0:
		s.badRequest(w, "release", "lease_ids", "lease_id or lease_ids: at least one lease id is required")
		return
	case len(ids) > MaxRelease:
		s.badRequest(w, "release", "lease_ids", fmt.Sprintf("lease_ids: %d ids, the limit is %d", len(ids), MaxRelease))
		return
	default:
		for i := range ids {
			fields = append(fields, fmt.Sprintf("lease_ids[%d]", i))
		}
	}
	// Every id is read before any is released: a malformed one releases nothing.
	for i, id := range ids {
		if _, err := limit.ParseLease(id); err != nil {
			s.badRequest(w, "release", fields[i], fields[i]+": "+err.Error())
			return
		}
	}
	now := s.cfg.Now()
	out := append(st.out[:0], `{"results":[`...)
	for i, id := range ids {
		state, err := s.cfg.Engine.Release(r.Context(), now, id, fields[i])
		if err != nil {
			s.checkFailed(w, "release", err)
			return
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"lease_id":`...)
		out = appendString(out, id)
		out = append(out, `,"released":`...)
		out = fmt.Appendf(out, "%t", state == limit.Released)
		out = append(out, `,"state":"`...)
		out = append(out, state.String()...)
		out = append(out, `"}`...)
	}
	st.out = append(out, "]}"...)
	s.cfg.Metrics.ObserveCheck("release", s.cfg.Now().Sub(now))
	writeJSON(w, http.StatusOK, st.out)
}

// setLease writes res's lease token to h (pop.LeaseHeader), when it has one.
func setLease(h http.Header, res *pop.Result) {
	if res.Lease != "" {
		h[pop.LeaseHeader] = []string{res.Lease}
	}
}

// appendLease appends `,"lease_id":"…"` to a result object when res holds a
// lease.
func appendLease(b []byte, res *pop.Result) []byte {
	if res.Lease == "" {
		return b
	}
	b = append(b, `,"lease_id":`...)
	return appendString(b, res.Lease)
}

// unitName is a limit's unit as Envoy's JSON spells it; a concurrency limit
// has no unit (Envoy's UNKNOWN).
func unitName(l *rules.Limit) string {
	if l.Concurrent() {
		return "UNKNOWN"
	}
	return l.Unit.Upper()
}

// window is a 429 body's window: the unit (1s, 1m, …), or "concurrent" for
// a concurrency limit, which counts requests in flight.
func window(l *rules.Limit) string {
	if l.Concurrent() {
		return "concurrent"
	}
	return shortDuration(l.Window())
}

// oneLeaseID reads the body every client sends, {"lease_id":"<token>"}
// exactly, without encoding/json; anything else (spaces, other fields,
// escapes) is left to the strict decoder, which agrees on this form.
func oneLeaseID(body []byte) (string, bool) {
	const pre, suf = `{"lease_id":"`, `"}`
	if len(body) < len(pre)+len(suf) || string(body[:len(pre)]) != pre || string(body[len(body)-len(suf):]) != suf {
		return "", false
	}
	tok := body[len(pre) : len(body)-len(suf)]
	for _, c := range tok {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "", false
		}
	}
	return string(tok), true
}
