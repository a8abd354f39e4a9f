package pop

import (
	"strconv"

	"github.com/edgelimit/edgelimit/pop/rules"
)

// The quota unit of a concurrency limit in RateLimit-Policy's qu parameter,
// as draft-ietf-httpapi-ratelimit-headers (-09 and later) registers it: q
// counts requests in flight at once, not requests per window, so the policy
// carries no w.
const concurrentRequests = "concurrent-requests"

// LeaseHeader is the response field that carries a check's lease token
// (Result.Lease) beside the JSON answer's lease_id.
const LeaseHeader = "X-Ratelimit-Lease"

// appendLimitPolicy appends l's RateLimit-Policy item: "name";q=;w= for a
// rate limit, "name";q=;qu="concurrent-requests" for a concurrency limit.
func appendLimitPolicy(b []byte, l *rules.Limit) []byte {
	if !l.Concurrent() {
		return appendPolicy(b, l.Name, l.Spec.Limit, Seconds(l.Window()))
	}
	b = appendSFString(b, l.Name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, l.Spec.Limit, 10)
	b = append(b, `;qu="`...)
	b = append(b, concurrentRequests...)
	return append(b, '"')
}

// appendResetParam appends the RateLimit field's ";t=" for st. A concurrency
// limit with a free slot has no reset to announce (a slot comes back when a
// holder finishes, not at a time), so it has none; denied, t is when the
// oldest lease expires, the latest a slot comes back.
func appendResetParam(b []byte, st *Status, t int64) []byte {
	if st.Limit.Concurrent() && st.Code == OK {
		return b
	}
	b = append(b, ";t="...)
	return strconv.AppendInt(b, t, 10)
}
