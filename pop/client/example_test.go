package client_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/edgelimit/edgelimit/pop/client"
)

// Put an HTTP handler behind a PoP: each request is checked by its API key,
// holds its concurrency lease while it is served, and gets the rate limit
// fields in its response. A PoP that does not answer within 50 ms lets the
// request through.
func ExampleClient_Middleware() {
	c, err := client.New(client.Config{URL: "http://127.0.0.1:8080", Timeout: 50 * time.Millisecond, FailOpen: true})
	if err != nil {
		panic(err)
	}
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "order created")
	})
	byKey := func(r *http.Request) (client.Request, bool) {
		key := r.Header.Get("X-API-Key")
		return client.Request{Domain: "api_platform", Descriptors: []client.Descriptor{
			{Entries: []client.Entry{{Key: "api_key", Value: key}}},
			{Entries: []client.Entry{{Key: "api_key", Value: key}, {Key: "endpoint", Value: r.Method + " " + r.URL.Path}}},
		}}, key != ""
	}
	http.Handle("/api/v1/orders", c.Middleware(byKey, orders))
}

// Limit a gRPC server's unary calls per method.
func ExampleClient_UnaryServerInterceptor() {
	c, err := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	if err != nil {
		panic(err)
	}
	byMethod := func(_ context.Context, method string, _ any) (client.Request, bool) {
		return client.Request{Domain: "grpc", Descriptors: []client.Descriptor{
			{Entries: []client.Entry{{Key: "method", Value: method}}},
		}}, true
	}
	_ = grpc.NewServer(grpc.UnaryInterceptor(c.UnaryServerInterceptor(byMethod)))
}

// Check and release by hand, around work that is not an HTTP handler.
func ExampleClient_Check() {
	c, err := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	d, err := c.Check(ctx, client.Request{Domain: "jobs", Descriptors: []client.Descriptor{
		{Entries: []client.Entry{{Key: "tenant", Value: "acme"}}},
	}})
	switch {
	case err != nil:
		fmt.Println("limiter unavailable:", err)
	case !d.Allowed:
		fmt.Println("retry after", d.RetryAfter)
	default:
		defer c.Release(ctx, d.Lease) // "" when no concurrency limit matched
		// ... the work ...
	}
}
