// Package filestamp tells when files changed, for the loaders that reload
// profiles and endpoints: a stamp of names, sizes and modification times.
package filestamp

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// File returns the stamp of one file.
func File(path string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %d %d\n", path, info.Size(), info.ModTime().UnixNano()), nil
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
