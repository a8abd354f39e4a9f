package httpapi

import (
	"net/http"
	"strconv"

	"github.com/edgelimit/edgelimit/pop"
)

// quotaExceeded is the problem type of draft-ietf-httpapi-ratelimit-headers
// for a request over one or more quota policies.
const quotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// problemType is the Content-Type of a problem details body (RFC 9457).
var problemType = []string{"application/problem+json"}

// appendProblem appends the client-facing body of a denial as problem
// details (RFC 9457) of the draft's quota-exceeded type: type, title,
// status, violated-policies (the names of the enforced limits that
// denied), and, as an extension member, the error object the body has always
// carried, so clients that read it keep working.
func appendProblem(b []byte, status int, req *pop.Request, res *pop.Result) []byte {
	b = append(b, `{"type":"`+quotaExceeded+`","title":"Request cannot be satisfied as assigned quota has been exceeded","status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"violated-policies":[`...)
	n := 0
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Code != pop.OverLimit || st.Limit == nil {
			continue
		}
		dup := false
		for j := range res.Statuses[:i] {
			o := &res.Statuses[j]
			dup = dup || o.Code == pop.OverLimit && o.Limit != nil && o.Limit.Name == st.Limit.Name
		}
		if dup {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		b = appendString(b, st.Limit.Name)
		n++
	}
	b = append(b, `],"error":`...)
	b = appendDenial(b, req, res)
	return append(b, '}')
}

// writeProblem writes a problem details response.
func writeProblem(w http.ResponseWriter, status int, body []byte) {
	w.Header()["Content-Type"] = problemType[:1:1]
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
