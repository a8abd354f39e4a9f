package natstest

import (
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// AsyncErrors collects the asynchronous errors of NATS connections —
// permissions violations among them, which a publish or subscribe does not
// return: pass Handler to nats.ErrorHandler or Conn.SetErrorHandler. Its
// zero value is ready; it is safe for concurrent use.
type AsyncErrors struct {
	mu   sync.Mutex
	errs []string
}

// Handler records err; it is a nats.ErrHandler.
func (a *AsyncErrors) Handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err.Error())
}

// Has reports whether an error recorded so far contains s.
func (a *AsyncErrors) Has(s string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.ContainsFunc(a.errs, func(e string) bool { return strings.Contains(e, s) })
}

// All returns the errors recorded so far.
func (a *AsyncErrors) All() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.errs)
}
