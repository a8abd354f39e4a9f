package pop

import (
	"math"
	"strconv"
	"time"
)

// The rate limit fields of a check's response, in the order HeaderValues
// returns their values, canonical as net/http writes them. Both the HTTP API
// and the gRPC service (response_headers_to_add) send them.
var HeaderNames = [...]string{
	"X-Ratelimit-Limit",     // the deciding limit's quota
	"X-Ratelimit-Remaining", // hits it allows now
	"X-Ratelimit-Reset",     // Unix seconds when it resets (or the request would fit)
	"Ratelimit-Policy",      // every enforced limit matched: "name";q=;w=
	"Ratelimit",             // the deciding limit: "name";r=;t=
	"Retry-After",           // on a denial only
}

// HeaderValues returns the values of the rate limit fields of res at now,
// value i for HeaderNames[i]: five of them, six with Retry-After on a denial,
// none when no enforced limit decided (res.Decisive < 0). t is the time until
// reset when allowed and the time until the request would fit when denied, so
// that Retry-After equals t and is never earlier. The values share one string
// and one slice: two allocations for all the fields.
func HeaderValues(now time.Time, res *Result) []string {
	if res.Decisive < 0 {
		return nil
	}
	st := &res.Statuses[res.Decisive]
	t := Seconds(st.Reset)
	denied := st.Code == OverLimit
	if denied {
		t = max(Seconds(st.RetryAfter), 1)
	}
	var buf [256]byte
	b := buf[:0]
	var ends [len(HeaderNames)]int
	b = strconv.AppendInt(b, st.Limit.Spec.Limit, 10)
	ends[0] = len(b)
	b = strconv.AppendInt(b, st.Remaining, 10)
	ends[1] = len(b)
	b = strconv.AppendInt(b, now.Unix()+t, 10)
	ends[2] = len(b)
	for i, l := range res.Policies {
		dup := false
		for _, p := range res.Policies[:i] {
			dup = dup || p.Name == l.Name
		}
		if dup {
			continue
		}
		if len(b) > ends[2] {
			b = append(b, ", "...)
		}
		b = appendLimitPolicy(b, l)
	}
	ends[3] = len(b)
	b = appendSFString(b, st.Limit.Name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, st.Remaining, 10)
	b = appendResetParam(b, st, t)
	ends[4] = len(b)
	b = strconv.AppendInt(b, t, 10)
	ends[5] = len(b)

	n := len(ends) - 1
	if denied {
		n++
	}
	all := string(b)
	vals := make([]string, n)
	start := 0
	for i := range vals {
		vals[i] = all[start:ends[i]]
		start = ends[i]
	}
	return vals
}

// UntilReset is the time a response reports as a status's
// duration_until_reset: until the request would fit when denied, else until
// the limit resets.
func (st *Status) UntilReset() time.Duration {
	if st.Code == OverLimit {
		return st.RetryAfter
	}
	return st.Reset
}

// Seconds rounds d up to whole seconds, as responses carry them.
func Seconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}

func appendPolicy(b []byte, name string, q, w int64) []byte {
	b = appendSFString(b, name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, q, 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, w, 10)
}

// appendSFString appends s as a Structured Field string (RFC 9651 §3.3.3):
// quoted, with '"' and '\' escaped; other non-printable bytes cannot appear in
// one and are replaced by '?'.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
