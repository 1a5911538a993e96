package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd serves a single-member etcd on loopback until SIGTERM/SIGINT: the store of a test
// control plane, so fsync is off (a crash loses a throwaway cluster, nothing else).
func runEtcd(args []string) int {
	flags := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := flags.String("data-dir", "", "where etcd keeps its data")
	client := flags.String("listen-client-urls", "http://127.0.0.1:2379", "client URL (loopback)")
	peer := flags.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL (loopback)")
	if err := flags.Parse(args); err != nil || *dataDir == "" {
		fmt.Fprintln(os.Stderr, "usage: kubestack etcd --data-dir DIR [--listen-client-urls URL] [--listen-peer-urls URL]")
		return 2
	}
	clientURL, err := url.Parse(*client)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-client-urls %q: %v\n", *client, err)
		return 2
	}
	peerURL, err := url.Parse(*peer)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-peer-urls %q: %v\n", *peer, err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true
	server, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
	defer server.Close()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-server.Server.ReadyNotify():
	case err := <-server.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
	select {
	case <-stop:
		return 0
	case err := <-server.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
