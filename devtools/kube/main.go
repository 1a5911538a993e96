// Command kubestack is the Kubernetes v1.37.2 control plane of docker-variant's tests and of
// scripts/kube-up, built from the Go module proxy: one multi-call binary (as hyperkube was)
// so that one link serves every component.
//
//	kubestack etcd --data-dir DIR --listen-client-urls URL   embedded etcd
//	kubestack kube-apiserver FLAGS...                        the real kube-apiserver
//	kubestack kube-scheduler FLAGS...                        the real kube-scheduler
//	kubestack kube-controller-manager FLAGS...               the real kube-controller-manager
//	kubestack cel-check < expressions.json                   the real DRA CEL compiler
//	kubestack version                                        the Kubernetes version built in
package main

import (
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/component-base/version"

	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubestack etcd|kube-apiserver|kube-scheduler|kube-controller-manager|cel-check|version [ARGS...]")
		os.Exit(2)
	}
	component, args := os.Args[1], os.Args[2:]
	// Each component parses os.Args through cobra: leave it only its own arguments.
	os.Args = append([]string{component}, args...)
	switch component {
	case "etcd":
		os.Exit(runEtcd(args))
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "cel-check":
		os.Exit(runCELCheck(os.Stdin, os.Stdout))
	case "version":
		fmt.Println(version.Get().GitVersion)
	default:
		fmt.Fprintf(os.Stderr, "kubestack: unknown component %q\n", component)
		os.Exit(2)
	}
}
