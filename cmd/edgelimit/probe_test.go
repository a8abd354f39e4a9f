package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// edgelimit probe asks the PoP the image's environment names, on loopback
// when it listens on a wildcard address, and fails unless it answers 200.
func TestProbe(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	t.Setenv("EDGELIMIT_LISTEN", "0.0.0.0:"+port)
	if err := runProbe(nil, io.Discard, io.Discard); err != nil {
		t.Fatalf("probe of a healthy PoP: %v", err)
	}
	status = http.StatusServiceUnavailable
	if err := runProbe(nil, io.Discard, io.Discard); err == nil {
		t.Fatal("probe of a PoP answering 503 succeeded")
	}
	if err := runProbe([]string{"--path", "/nope"}, io.Discard, io.Discard); err == nil {
		t.Fatal("probe of a path answering 404 succeeded")
	}
}
