package tap

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/inmesh/inmesh/internal/authority"
)

// ServeHTTP serves [Hub.Stream] to the clients the access rule admits
// (loopback clients asking for a loopback Host, "localhost" or a loopback
// address, unless [WithAccess] says otherwise); others get 403.
func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.allow(r) {
		http.Error(w, "tap: only loopback clients may watch", http.StatusForbidden)
		return
	}
	h.Stream(w, r)
}

// allow applies the access rule.
func (h *Hub) allow(r *http.Request) bool {
	if h.access != nil {
		return h.access(r)
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback() && authority.IsLoopbackHost(r.Host)
}

// Stream streams the events that pass the request's filter (see
// [ParseFilter]) until the client goes away: as Server-Sent Events when the
// client accepts text/event-stream (a browser's EventSource), else as one
// JSON object per line (application/x-ndjson) for a command line. A bad
// filter is 400; past the watcher bound, 503. A comment line or an empty
// event every 15 seconds keeps idle streams open through intermediaries. A
// viewer that stops reading is dropped once a write has waited the write
// timeout ([WithWriteTimeout]).
// It checks no access: it is for a handler that admitted the client
// itself, as the dashboard does.
func (h *Hub) Stream(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "tap: GET only", http.StatusMethodNotAllowed)
		return
	}
	f, err := ParseFilter(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	watcher, err := h.Watch(f, 0)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer watcher.Close()
	sse := strings.Contains(r.Header.Get("Accept"), "text/event-stream")
	if sse {
		w.Header().Set("Content-Type", "text/event-stream")
	} else {
		w.Header().Set("Content-Type", "application/x-ndjson")
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// Each round of writes gets the write timeout from its start: a
	// deadline left from an earlier round would fail a stream that was
	// only idle.
	deadline := func() error { return rc.SetWriteDeadline(time.Now().Add(h.writeTimeout)) }
	if err := deadline(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return
	}
	if sse {
		_, _ = w.Write([]byte(": tap\n\n"))
	}
	if err := rc.Flush(); err != nil {
		return
	}
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	// The first event of a quiet stream wakes it; the stream then waits
	// FlushDelay without reading, so that the events of a busy stack queue
	// in the watcher's buffer without waking it one by one, and sends
	// them together in one write. A viewer sees an event within
	// FlushDelay of its request. The buffer (DefaultBuffer) holds what
	// more than 50,000 requests a second bring in that time.
	wait := time.NewTimer(FlushDelay)
	wait.Stop()
	defer wait.Stop()
	enc := json.NewEncoder(w)
	write := func(e *Event) error {
		if sse {
			if _, err := w.Write([]byte("data: ")); err != nil {
				return err
			}
		}
		if err := enc.Encode(e); err != nil { // ends with a newline
			return err
		}
		if sse {
			_, err := w.Write([]byte("\n"))
			return err
		}
		return nil
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keepalive.C:
			_ = deadline()
			if sse {
				_, err = w.Write([]byte(": keepalive\n\n"))
			} else {
				_, err = w.Write([]byte("\n"))
			}
		case e := <-watcher.Events():
			_ = deadline()
			err = write(&e)
			wait.Reset(FlushDelay)
			select {
			case <-r.Context().Done():
				return
			case <-wait.C:
			}
			// What was queued meanwhile, and no more: a stack faster than
			// the viewer fills the buffer and loses events, counted.
			for n := len(watcher.Events()); n > 0 && err == nil; n-- {
				e := <-watcher.Events()
				err = write(&e)
			}
		}
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// FlushDelay is the longest an event waits before its stream sends it to
// the viewer.
const FlushDelay = 5 * time.Millisecond
