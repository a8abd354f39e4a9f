package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

// runBaseline serves a trivial net/http handler that answers every request
// with a small JSON body, as a PoP's allowed check does. 'edgelimit load'
// against it measures what this machine's HTTP stack can do at all, so PoP
// figures can be given as a ratio of a baseline measured in the same run.
func runBaseline(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("baseline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8089", "address to serve on")
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	body := []byte(`{"overall_code":"OK"}`)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header()["Content-Type"] = []string{"application/json"}
		_, _ = w.Write(body)
	})}
	fmt.Fprintf(stderr, "baseline: trivial handler on %s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}
