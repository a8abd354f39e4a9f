package grpcapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/edgelimit/edgelimit/pop"
)

// maxJSONBody caps a /json request body, as /v1/check caps its own.
const maxJSONBody = 64 << 10

// DecodeJSON decodes body, Envoy's RateLimitRequest in the protobuf JSON
// mapping (camelCase or snake_case field names, integers as numbers or
// strings, units by name or number), into a pop.Request, as ShouldRateLimit
// maps a request. Unknown fields are an error. The HTTP API uses it for the
// bodies its plain decoder refuses.
func DecodeJSON(body []byte) (*pop.Request, error) {
	return decodeJSON(body, new(rlsv3.RateLimitRequest))
}

// decodeJSON is DecodeJSON, decoding the message into in.
func decodeJSON(body []byte, in *rlsv3.RateLimitRequest) (*pop.Request, error) {
	if err := protojson.Unmarshal(body, in); err != nil {
		return nil, err
	}
	st := new(state)
	if err := st.decode(in); err != nil {
		return nil, err
	}
	return &st.req, nil
}

// JSONHandler serves POST /json as Envoy's ratelimit serves it: the body is
// a RateLimitRequest in protobuf JSON, the answer the RateLimitResponse that
// ShouldRateLimit would give, written by protojson (camelCase, so that
// protojson.Unmarshal takes it back without DiscardUnknown), 200 when OK and
// 429 when OVER_LIMIT. The rate limit headers go out as HTTP headers, not in
// the body (Envoy's ratelimit leaves response_headers_to_add out of it by
// default). A malformed request gets 400 with a JSON error naming the
// problem, where Envoy's ratelimit answers a bare "Bad Request".
type JSONHandler struct {
	cfg Config
}

// NewJSONHandler returns the /json handler over cfg.Engine; cfg.Options and
// cfg.Requests are not used.
func NewJSONHandler(cfg Config) *JSONHandler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &JSONHandler{cfg: cfg}
}

func (h *JSONHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		jsonError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "use POST with a protobuf-JSON RateLimitRequest body")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			jsonError(w, http.StatusRequestEntityTooLarge, "BODY_TOO_LARGE", "the body is larger than "+strconv.Itoa(maxJSONBody)+" bytes")
			return
		}
		jsonError(w, http.StatusBadRequest, "BAD_REQUEST", "reading the body: "+err.Error())
		return
	}
	var in rlsv3.RateLimitRequest
	req, err := decodeJSON(body, &in)
	if err != nil {
		h.cfg.Metrics.BadRequest("json")
		jsonError(w, http.StatusBadRequest, "BAD_REQUEST", err.Error())
		return
	}
	var res pop.Result
	now := h.cfg.Now()
	err = h.cfg.Engine.CheckAt(r.Context(), now, req, &res)
	h.cfg.Metrics.ObserveCheck("json", h.cfg.Now().Sub(now))
	if err != nil {
		var re *pop.RequestError
		switch {
		case errors.As(err, &re):
			h.cfg.Metrics.BadRequest("json")
			jsonError(w, http.StatusBadRequest, "BAD_REQUEST", re.Error())
		case errors.Is(err, context.Canceled):
		default:
			jsonError(w, http.StatusServiceUnavailable, "STORE_UNAVAILABLE", err.Error())
		}
		return
	}
	resp := h.cfg.response(now, &in, &res)
	if !h.cfg.EnvoyCompat {
		for _, hv := range resp.ResponseHeadersToAdd {
			w.Header()[hv.Key] = []string{hv.Value}
		}
		resp.ResponseHeadersToAdd = nil
	}
	out, err := protojson.Marshal(resp)
	if err != nil { // a message we built: cannot fail
		jsonError(w, http.StatusInternalServerError, "INTERNAL", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if res.Code == pop.OverLimit {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = w.Write(out)
}

// jsonError writes {"error":{"code","message"}} as the HTTP API's errors are.
func jsonError(w http.ResponseWriter, status int, code, msg string) {
	m, _ := json.Marshal(msg) // a string always marshals
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(`{"error":{"code":"` + code + `","message":` + string(m) + `}}`))
}
