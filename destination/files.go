package destination

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/inmesh/inmesh/internal/filestamp"
)

// WatchFiles loads the ServiceProfile YAML files (*.yaml, *.yml) of
// profilesDir and the endpoints file into store, then checks them every
// interval and loads again what changed, until ctx is done. Either path may
// be empty. A file that fails to load is logged with its file, document and
// field, and the store keeps serving the last good version. WatchFiles
// returns the error of the first load, without watching, when it fails.
func WatchFiles(ctx context.Context, store *Store, profilesDir, endpointsFile string, interval time.Duration, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	if interval <= 0 {
		interval = time.Second
	}
	w := &fileWatcher{store: store, dir: profilesDir, endpoints: endpointsFile, log: log}
	if err := w.load(true); err != nil {
		return err
	}
	go w.run(ctx, interval)
	return nil
}

type fileWatcher struct {
	store                        *Store
	dir, endpoints               string
	log                          *slog.Logger
	profilesStamp, endpointStamp string
}

func (w *fileWatcher) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.load(false); err != nil {
				w.log.Warn("rejected a control-plane file; serving the last good version", "error", err)
			}
		}
	}
}

func (w *fileWatcher) load(first bool) error {
	var errs []string
	if w.dir != "" {
		paths, stamp, err := filestamp.YAMLFiles(w.dir)
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		case stamp != w.profilesStamp:
			w.profilesStamp = stamp
			if err := w.store.LoadServiceProfiles(paths...); err != nil {
				errs = append(errs, err.Error())
			} else if !first {
				w.log.Info("loaded service profiles", "dir", w.dir, "files", len(paths))
			}
		}
	}
	if w.endpoints != "" {
		stamp, err := filestamp.File(w.endpoints)
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		case stamp != w.endpointStamp:
			w.endpointStamp = stamp
			if err := w.store.LoadEndpoints(w.endpoints); err != nil {
				errs = append(errs, err.Error())
			} else if !first {
				w.log.Info("loaded endpoints", "file", w.endpoints)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// WatchManifestFiles loads the Service, HTTPRoute and GRPCRoute manifests
// (*.yaml, *.yml) of dir into store for the OutboundPolicies API, then
// checks them every interval and loads again when any changed, until ctx
// is done. A bad file is logged with its file, document and field, and the
// store keeps serving the last good version. The error of the first load
// is returned, without watching.
func WatchManifestFiles(ctx context.Context, store *Store, dir string, interval time.Duration, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	if interval <= 0 {
		interval = time.Second
	}
	var stamp string
	load := func(first bool) error {
		paths, s, err := filestamp.YAMLFiles(dir)
		if err != nil || s == stamp {
			return err
		}
		stamp = s
		if err := store.LoadManifests(paths...); err != nil {
			return err
		}
		if !first {
			log.Info("loaded policy manifests", "dir", dir, "files", len(paths))
		}
		return nil
	}
	if err := load(true); err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := load(false); err != nil {
					log.Warn("rejected a policy manifest; serving the last good version", "error", err)
				}
			}
		}
	}()
	return nil
}
