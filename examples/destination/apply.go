package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/manifest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// commandTimeout bounds apply, delete and get.
const commandTimeout = 30 * time.Second

// reachTimeout bounds the first answer of etcd, so that a command given
// endpoints that do not answer says so soon.
const reachTimeout = 5 * time.Second

// reach checks that etcd answers a read of the prefix within reachTimeout.
func reach(cli *clientv3.Client, ef etcdFlags) error {
	ctx, cancel := context.WithTimeout(context.Background(), reachTimeout)
	defer cancel()
	if _, err := cli.Get(ctx, ef.prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("etcd at %s did not answer within %s: %w", strings.Join(ef.endpoints, ","), reachTimeout, err)
	}
	return nil
}

// runCommand runs the apply, delete and get subcommands, which edit and
// list the manifests and endpoints held in etcd:
//
//	destination apply -etcd-endpoints URLS -f DIR_OR_FILE [-f ...] [-endpoints FILE]
//	destination delete -etcd-endpoints URLS [-f DIR_OR_FILE ...] [-endpoints FILE] [NAME ...]
//	destination get -etcd-endpoints URLS
//
// apply validates the files with the control plane's own loader, alone and
// together with what etcd already holds, and writes each resource under
// its own key in one transaction, only the keys whose bytes differ from
// what etcd holds, printing each key as created, configured or unchanged
// (as kubectl apply); a bad document is refused with its file, document
// and field, and nothing is written. delete removes the resources
// of files, or the keys that get names. It returns the process's exit
// code.
func runCommand(name string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var ef etcdFlags
	fs.Func("etcd-endpoints", "comma-separated etcd client URLs", func(v string) error { ef.endpoints = splitList(v); return nil })
	fs.StringVar(&ef.prefix, "etcd-prefix", "/inmesh", "etcd key prefix of the manifests and endpoints")
	fs.StringVar(&ef.caFile, "etcd-cacert", "", "PEM file of the CAs that sign etcd's server certificates")
	fs.StringVar(&ef.certFile, "etcd-cert", "", "PEM client certificate for etcd")
	fs.StringVar(&ef.keyFile, "etcd-key", "", "PEM private key of -etcd-cert")
	var files, endpoints []string
	if name != "get" {
		fs.Func("f", "manifest file, or directory of *.yaml and *.yml files (repeatable)", func(v string) error { files = append(files, v); return nil })
		fs.Func("endpoints", "endpoints file (repeatable)", func(v string) error { endpoints = append(endpoints, v); return nil })
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "destination %s: %v\n", name, err)
		return 1
	}
	if len(ef.endpoints) == 0 {
		return fail(errors.New("-etcd-endpoints is required"))
	}
	if name != "get" && len(files)+len(endpoints)+fs.NArg() == 0 {
		return fail(errors.New("nothing to do: give -f, -endpoints, or key names as get lists them"))
	}
	if name == "apply" && fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments %q: give files with -f", fs.Args()))
	}
	paths, err := expand(files)
	if err != nil {
		return fail(err)
	}
	change := etcdstore.Change{}
	if change.Manifests, err = read(paths); err != nil {
		return fail(err)
	}
	if change.Endpoints, err = read(endpoints); err != nil {
		return fail(err)
	}
	cli, err := ef.client()
	if err != nil {
		return fail(err)
	}
	defer cli.Close()
	if err := reach(cli, ef); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	switch name {
	case "apply":
		r, err := etcdstore.ApplyReport(ctx, cli, ef.prefix, change)
		if err != nil {
			return fail(fmt.Errorf("%w (nothing written)", err))
		}
		wrote := false
		for _, k := range r.Keys {
			fmt.Fprintf(stdout, "%s %s\n", k.Name, k.Action)
			wrote = wrote || k.Action != etcdstore.Unchanged
		}
		if wrote {
			fmt.Fprintf(stdout, "revision %d\n", r.Revision)
		} else {
			fmt.Fprintf(stdout, "revision %d (nothing written)\n", r.Revision)
		}
	case "delete":
		names, err := etcdstore.Names(change)
		if err != nil {
			return fail(fmt.Errorf("%w (nothing deleted)", err))
		}
		names = append(names, fs.Args()...)
		rev, err := etcdstore.Delete(ctx, cli, ef.prefix, names)
		if err != nil {
			return fail(fmt.Errorf("%w (nothing deleted)", err))
		}
		for _, n := range names {
			fmt.Fprintf(stdout, "%s deleted\n", n)
		}
		fmt.Fprintf(stdout, "revision %d\n", rev)
	case "get":
		keys, err := etcdstore.List(ctx, cli, ef.prefix)
		if err != nil {
			return fail(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tREVISION\tBYTES")
		for _, k := range keys {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", k.Name, k.ModRevision, k.Size)
		}
		tw.Flush()
	}
	return 0
}

// expand lists the manifest files of the -f arguments: a directory gives
// its *.yaml and *.yml files, sorted.
func expand(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		info, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			out = append(out, a)
			continue
		}
		entries, err := os.ReadDir(a)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
				out = append(out, filepath.Join(a, e.Name()))
			}
		}
	}
	return out, nil
}

func read(paths []string) ([]manifest.File, error) {
	var out []manifest.File
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, manifest.File{Name: p, Data: data})
	}
	return out, nil
}
