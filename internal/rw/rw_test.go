package rw

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type base struct{ http.ResponseWriter }
type flusher struct{ base }

func (flusher) Flush() {}

type hijacker struct{ base }

func (hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, nil }

type all struct{ base }

func (all) Flush()                                       {}
func (all) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, nil }
func (all) ReadFrom(r io.Reader) (int64, error)          { return io.Copy(io.Discard, r) }
func (all) Push(string, *http.PushOptions) error         { return nil }

func TestExactInterfaces(t *testing.T) {
	rec := httptest.NewRecorder()
	for _, tc := range []struct {
		name                          string
		w                             http.ResponseWriter
		flush, hijack, readFrom, push bool
	}{
		{"plain", base{rec}, false, false, false, false},
		{"flusher", flusher{base{rec}}, true, false, false, false},
		{"hijacker", hijacker{base{rec}}, false, true, false, false},
		{"all", all{base{rec}}, true, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, st := Wrap(tc.w)
			defer st.Release()
			_, f := w.(http.Flusher)
			_, h := w.(http.Hijacker)
			_, r := w.(io.ReaderFrom)
			_, p := w.(http.Pusher)
			assert.Equal(t, []bool{tc.flush, tc.hijack, tc.readFrom, tc.push}, []bool{f, h, r, p})
			assert.Equal(t, tc.w, w.(interface{ Unwrap() http.ResponseWriter }).Unwrap())
		})
	}
}

// sink accepts any sequence of calls.
type sink struct{ h http.Header }

func (s *sink) Header() http.Header         { return s.h }
func (s *sink) Write(p []byte) (int, error) { return len(p), nil }
func (s *sink) WriteHeader(int)             {}

func TestState(t *testing.T) {
	w, st := Wrap(&sink{h: http.Header{}})
	w.Header().Set("Trailer", "Grpc-Status")
	w.WriteHeader(http.StatusContinue) // 1xx does not count
	w.WriteHeader(http.StatusAccepted)
	w.WriteHeader(http.StatusTeapot) // only the first counts
	n, err := w.Write([]byte("hello"))
	require.NoError(t, err)
	w.Header().Set("Grpc-Status", "0")
	assert.Equal(t, 5, n)
	assert.Equal(t, http.StatusAccepted, st.Status)
	assert.Equal(t, int64(5), st.Written)
	assert.False(t, st.GRPCStatusInHead)
	v, ok := st.Trailer("Grpc-Status")
	assert.True(t, ok)
	assert.Equal(t, "0", v)
	st.Release()

	w, st = Wrap(httptest.NewRecorder())
	w.Write([]byte("x"))
	assert.Equal(t, http.StatusOK, st.Status, "a write before WriteHeader means 200")
	st.Release()
}

func TestOnHead(t *testing.T) {
	for name, send := range map[string]func(http.ResponseWriter){
		"WriteHeader": func(w http.ResponseWriter) { w.WriteHeader(204); w.WriteHeader(500) },
		"Write":       func(w http.ResponseWriter) { w.Write([]byte("a")); w.Write([]byte("b")) },
		"Flush":       func(w http.ResponseWriter) { w.(http.Flusher).Flush(); w.Write([]byte("b")) },
		"ReadFrom":    func(w http.ResponseWriter) { w.(io.ReaderFrom).ReadFrom(strings.NewReader("x")) },
	} {
		t.Run(name, func(t *testing.T) {
			rec := &readFromRecorder{httptest.NewRecorder()}
			w, st := Wrap(rec)
			calls := 0
			st.OnHead = func(h http.Header) { calls++; h.Set("X-Head", "set") }
			send(w)
			assert.Equal(t, 1, calls, "called once, before the head")
			assert.Equal(t, "set", rec.Result().Header.Get("X-Head"), "the edit is in the head sent")
			st.Release()
		})
	}
}

type readFromRecorder struct{ *httptest.ResponseRecorder }

func (r *readFromRecorder) ReadFrom(src io.Reader) (int64, error) {
	return io.Copy(r.ResponseRecorder, src)
}

func TestWrapAllocatesNothing(t *testing.T) {
	rec := httptest.NewRecorder()
	allocs := testing.AllocsPerRun(1000, func() {
		w, st := Wrap(rec)
		w.WriteHeader(200)
		st.Release()
	})
	assert.Zero(t, allocs)
}

// stringSink is a sink that is an io.StringWriter, as net/http's writers
// are; strings counts the strings it was given whole.
type stringSink struct {
	sink
	strings int
}

func (s *stringSink) WriteString(str string) (int, error) { s.strings++; return len(str), nil }

// A handler's io.WriteString reaches the writer's own WriteString through
// the wrapper, with no copy into a byte slice; through a writer without
// one, it is written as bytes. Either way it counts as a body write.
func TestWriteString(t *testing.T) {
	ss := &stringSink{sink: sink{h: http.Header{}}}
	w, st := Wrap(ss)
	heads := 0
	st.OnHead = func(http.Header) { heads++ }
	n, err := io.WriteString(w, "hello")
	require.NoError(t, err)
	assert.Equal(t, 5, n)
	assert.Equal(t, 1, ss.strings, "the writer's own WriteString")
	assert.Equal(t, http.StatusOK, st.Status, "a write before WriteHeader means 200")
	assert.Equal(t, 1, heads)
	assert.Equal(t, int64(5), st.Written)
	allocs := testing.AllocsPerRun(1000, func() { _, _ = io.WriteString(w, "hello") })
	assert.Zero(t, allocs, "no copy of the string")
	st.Release()

	rec := httptest.NewRecorder()
	w, st = Wrap(&base{rec})
	n, err = io.WriteString(w, "abc")
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Equal(t, "abc", rec.Body.String())
	assert.Equal(t, int64(3), st.Written)
	st.Release()
}

// The generated wrappers are up to date with gen.go.
func TestGeneratedUpToDate(t *testing.T) {
	want, err := os.ReadFile("wrap_generated.go")
	require.NoError(t, err)
	dir := t.TempDir()
	src, err := os.ReadFile("gen.go")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(dir+"/gen.go", src, 0o644))
	cmd := exec.Command("go", "run", "gen.go")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	got, err := os.ReadFile(dir + "/wrap_generated.go")
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got), "run go generate ./internal/rw")
}
