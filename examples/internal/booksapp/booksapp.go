// Package booksapp is the plain HTTP/1 books service of the examples. It
// knows nothing of the mesh; it reports what it saw of each request in
// response headers (X-App-Proto, X-App-L5d-Headers), so that a test can
// check what the mesh delivered.
package booksapp

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Handler serves GET /books, GET /books/{id}, POST /books, GET /authors,
// GET /authors/{id}, GET /flaky (every other call fails with 503) and GET
// /slow (answers after slow).
func Handler(slow time.Duration) http.Handler {
	var flaky atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /books", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `["dune","emma"]`) })
	mux.HandleFunc("GET /books/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"id":%q}`, r.PathValue("id"))
	})
	mux.HandleFunc("GET /authors", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `["herbert","austen"]`) })
	mux.HandleFunc("GET /authors/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"author":%q}`, r.PathValue("id"))
	})
	mux.HandleFunc("POST /books", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	})
	mux.HandleFunc("GET /flaky", func(w http.ResponseWriter, r *http.Request) {
		if flaky.Add(1)%2 == 1 {
			http.Error(w, "flaked", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "recovered")
	})
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(slow):
			io.WriteString(w, "slow")
		case <-r.Context().Done():
		}
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l5d := 0
		for name := range r.Header {
			if strings.HasPrefix(strings.ToLower(name), "l5d-") {
				l5d++
			}
		}
		w.Header().Set("X-App-Proto", r.Proto)
		w.Header().Set("X-App-L5d-Headers", strconv.Itoa(l5d))
		mux.ServeHTTP(w, r)
	})
}
