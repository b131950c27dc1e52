// Package filestamp tells when files changed, for the loaders that reload
// profiles and endpoints: a stamp of names, sizes and modification times, a
// read that notices a file changing under it, and a [Settle] rule that
// waits for a file to stop changing before it is loaded.
package filestamp

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ErrChanged is returned by [Read] when the file's size or modification time
// differed before and after the read: it was still being written. The
// caller reads it again later.
var ErrChanged = errors.New("file changed while it was read; reading it again later")

// File returns the stamp of one file.
func File(path string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	return stamp(path, info), nil
}

func stamp(path string, info fs.FileInfo) string {
	return fmt.Sprintf("%s %d %d\n", path, info.Size(), info.ModTime().UnixNano())
}

// Read returns the content of path, or an error wrapping [ErrChanged] when
// the file changed during the read (its size or modification time differ
// before and after, or the bytes read are not its size).
func Read(path string) ([]byte, error) {
	before, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	after, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if stamp(path, before) != stamp(path, after) || int64(len(data)) != after.Size() {
		return nil, fmt.Errorf("%s: %w", path, ErrChanged)
	}
	return data, nil
}

// YAMLFiles lists the *.yaml and *.yml files of dir, sorted, with a stamp
// that changes when any of them changes, appears or goes.
func YAMLFiles(dir string) ([]string, string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, "", err
	}
	var paths []string
	for _, e := range entries {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			paths = append(paths, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(paths)
	var stamp strings.Builder
	for _, p := range paths {
		s, err := File(p)
		if err != nil {
			return nil, "", err
		}
		stamp.WriteString(s)
	}
	return paths, stamp.String(), nil
}

// Settle decides when files polled at an interval are loaded: a stamp is
// ready once it differs from the last one loaded and was already seen at the
// previous poll, so a file is loaded only after it stayed the same for one
// interval. A copy caught half-way by one poll is thus not loaded; the
// finished file is, one poll later. The zero Settle is ready for the first
// stamp it sees only from the second poll on; a loader that loads at start
// calls [Settle.Loaded] first. A Settle is not safe for concurrent use.
type Settle struct {
	loaded, seen string
	hasLoaded    bool
}

// Ready records stamp as seen at this poll and reports whether to load it.
func (s *Settle) Ready(stamp string) bool {
	if s.hasLoaded && stamp == s.loaded {
		s.seen = stamp
		return false
	}
	ready := stamp == s.seen
	s.seen = stamp
	return ready
}

// Loaded records that the files of stamp were read (whether or not their
// content was good), so that they are not read again until they change.
func (s *Settle) Loaded(stamp string) {
	s.loaded, s.seen, s.hasLoaded = stamp, stamp, true
}
