// Command kvgate-cluster is one multi-call binary holding a Kubernetes control plane:
// etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a matching kubectl, all
// built from the Go modules of one pinned Kubernetes release (see go.mod and gen-gomod.sh).
//
// It dispatches on the base name of argv[0] (so symlinks named after each component work),
// or, when invoked under its own name, on its first argument:
//
//	kvgate-cluster kube-apiserver --etcd-servers=...
//	ln -s kvgate-cluster etcd && ./etcd --data-dir=...
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones, as upstream's mains do

	"go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/component-base/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// components maps a component name to a function running it with its arguments (os.Args is
// already rewritten to look like the component's own argv) and returning the exit code.
var components = map[string]func(args []string) int{
	"etcd": func(args []string) int {
		// etcdmain parses os.Args itself and exits on its own.
		etcdmain.Main(append([]string{"etcd"}, args...))
		return 0
	},
	"kube-apiserver": func(args []string) int {
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kube-controller-manager": func(args []string) int {
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kube-scheduler": func(args []string) int {
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kubectl": func(args []string) int {
		// As upstream's main: verbosity must be known before the command is built.
		_, _ = logs.GlogSetter(kubectl.GetLogVerbosity(os.Args))
		cmd := kubectl.NewDefaultKubectlCommand()
		if err := cli.RunNoErrOutput(cmd); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
}

func usage() int {
	names := make([]string, 0, len(components))
	for name := range components {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "kvgate-cluster %s\nusage: kvgate-cluster COMPONENT [flags]\ncomponents: %v, version\n",
		version.Get().GitVersion, names)
	return 2
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if _, ok := components[name]; !ok {
		if len(args) == 0 {
			os.Exit(usage())
		}
		name, args = args[0], args[1:]
	}
	if name == "version" {
		fmt.Println(version.Get().GitVersion)
		return
	}
	run, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kvgate-cluster: unknown component %q\n", name)
		os.Exit(usage())
	}
	os.Args = append([]string{name}, args...)
	os.Exit(run(args))
}
