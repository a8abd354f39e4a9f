package client

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Middleware returns next behind the PoP: describe maps each request to a
// check (ok false serves it unchecked). A request the PoP admits is served
// with the rate limit fields added to its response, holding its concurrency
// lease until next returns — or panics — and then releasing it. A denied
// request gets the PoP's 429 (its fields and its JSON error object) and never
// reaches next. When the PoP cannot answer within Config.Timeout (or the
// request's own deadline), the request is served (FailOpen) or refused with a
// 503 and Retry-After: 1.
func (c *Client) Middleware(describe func(*http.Request) (Request, bool), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, ok := describe(r)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		d, err := c.Check(r.Context(), req)
		if err != nil {
			c.failed(err)
			if c.cfg.FailOpen {
				next.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusServiceUnavailable, []byte(`{"error":{"code":"RATE_LIMITER_UNAVAILABLE","message":"the rate limiter did not answer; retry shortly"}}`))
			return
		}
		h := w.Header()
		for k, v := range d.Header {
			h[k] = v
		}
		if !d.Allowed {
			writeJSON(w, http.StatusTooManyRequests, denialBody(d))
			return
		}
		defer c.release(r.Context(), d.Lease) // also when next panics
		if d.Lease != "" {
			r = r.WithContext(context.WithValue(r.Context(), leaseKey{}, d.Lease))
		}
		next.ServeHTTP(w, r)
	})
}

// UnaryServerInterceptor is Middleware for a gRPC server: describe maps a
// call (its context, full method name and request message) to a check. A
// denied call fails with ResourceExhausted; a PoP that cannot answer fails it
// with Unavailable unless FailOpen. The rate limit fields travel as response
// header metadata (lower-case names), and a lease is held while the handler
// runs and released after it returns or panics.
func (c *Client) UnaryServerInterceptor(describe func(ctx context.Context, method string, req any) (Request, bool)) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, msg any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		req, ok := describe(ctx, info.FullMethod, msg)
		if !ok {
			return handler(ctx, msg)
		}
		d, err := c.Check(ctx, req)
		if err != nil {
			c.failed(err)
			if c.cfg.FailOpen {
				return handler(ctx, msg)
			}
			return nil, status.Error(codes.Unavailable, "rate limiter unavailable: "+err.Error())
		}
		if len(d.Header) > 0 {
			md := metadata.MD{}
			for k, v := range d.Header {
				md[strings.ToLower(k)] = v
			}
			_ = grpc.SetHeader(ctx, md) // fails only outside a server call
		}
		if !d.Allowed {
			return nil, status.Error(codes.ResourceExhausted, "rate limit exceeded; retry after "+strconv.FormatInt(int64(d.RetryAfter.Seconds()), 10)+"s")
		}
		defer c.release(ctx, d.Lease)
		if d.Lease != "" {
			ctx = context.WithValue(ctx, leaseKey{}, d.Lease)
		}
		return handler(ctx, msg)
	}
}

type leaseKey struct{}

// LeaseFromContext returns the concurrency lease the request of ctx holds
// while its handler runs (Middleware, UnaryServerInterceptor), or "".
func LeaseFromContext(ctx context.Context) string {
	l, _ := ctx.Value(leaseKey{}).(string)
	return l
}

// release frees lease after the request's handler, even when the request's
// context has ended (the client went away): the slot must come back.
func (c *Client) release(ctx context.Context, lease string) {
	if lease == "" {
		return
	}
	if err := c.Release(context.WithoutCancel(ctx), lease); err != nil {
		c.failed(err) // the lease's TTL frees the slot
	}
}

func (c *Client) failed(err error) {
	if c.cfg.OnError != nil {
		c.cfg.OnError(err)
	}
}

// denialBody is the body of a 429: the PoP's error object, or a short one
// when the check went over gRPC.
func denialBody(d Decision) []byte {
	var ans struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(d.Body, &ans) == nil && len(ans.Error) > 0 {
		return append(append([]byte(`{"error":`), ans.Error...), '}')
	}
	return []byte(`{"error":{"code":"RATE_LIMITED","message":"Rate limit exceeded.","retry_after":` + strconv.FormatInt(int64(d.RetryAfter.Seconds()), 10) + `}}`)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
