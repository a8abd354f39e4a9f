package httpapi

import (
	"net/http"
	"strconv"

	"github.com/edgelimit/edgelimit/pop/rules"
)

// maxTop is the most entries GET /v1/top returns.
const maxTop = 1000

// handleTop lists the most limited keys, most denied first:
//
//	GET /v1/top?n=10 → {"total": N, "keys": [{"key", "count", "error"}, …]}
//
// count is the key's denials since the PoP started, as the sketch counts
// them: at most error above the truth. total is every denial counted.
func (s *Server) handleTop(w http.ResponseWriter, r *http.Request) {
	n := 10
	if v := r.URL.Query().Get("n"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > maxTop {
			writeError(w, http.StatusBadRequest, "BAD_REQUEST", "n", "n: must be an integer from 1 to "+strconv.Itoa(maxTop)+", got "+strconv.Quote(v))
			return
		}
	}
	b := []byte(`{"total":`)
	b = strconv.AppendUint(b, s.cfg.TopKeys.Total(), 10)
	b = append(b, `,"keys":[`...)
	for i, e := range s.cfg.TopKeys.Top(n) {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendString(b, rules.DescribeKey(e.Key))
		b = append(b, `,"count":`...)
		b = strconv.AppendUint(b, e.Count, 10)
		b = append(b, `,"error":`...)
		b = strconv.AppendUint(b, e.Err, 10)
		b = append(b, '}')
	}
	writeJSON(w, http.StatusOK, append(b, "]}"...))
}
