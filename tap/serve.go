package tap

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// ServeHTTP streams the events that pass the request's filter (see
// [ParseFilter]) until the client goes away: as Server-Sent Events when the
// client accepts text/event-stream (a browser's EventSource), else as one
// JSON object per line (application/x-ndjson) for a command line. A bad
// filter is 400; past the watcher bound, 503. A comment line or an empty
// event every 15 seconds keeps idle streams open through intermediaries.
func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
	if sse {
		_, _ = w.Write([]byte(": tap\n\n"))
	}
	if err := rc.Flush(); err != nil {
		return
	}
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	// Events are written as they come but flushed at most every
	// FlushDelay: a busy stack's events share a write (and the viewer's
	// read) instead of costing one each, and a viewer sees an event
	// within FlushDelay of its request.
	flush := time.NewTimer(FlushDelay)
	flush.Stop()
	defer flush.Stop()
	pending := false
	enc := json.NewEncoder(w)
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keepalive.C:
			if sse {
				_, err = w.Write([]byte(": keepalive\n\n"))
			} else {
				_, err = w.Write([]byte("\n"))
			}
			if err == nil {
				err = rc.Flush()
			}
			pending = false
		case <-flush.C:
			err = rc.Flush()
			pending = false
		case e := <-watcher.Events():
			if sse {
				_, err = w.Write([]byte("data: "))
			}
			if err == nil {
				err = enc.Encode(&e) // ends with a newline
			}
			if err == nil && sse {
				_, err = w.Write([]byte("\n"))
			}
			if err == nil && !pending {
				pending = true
				flush.Reset(FlushDelay)
			}
		}
		if err != nil {
			return
		}
	}
}

// FlushDelay is the longest an event waits in a stream's buffer before
// it is sent to the viewer.
const FlushDelay = 20 * time.Millisecond
