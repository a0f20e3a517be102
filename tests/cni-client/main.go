// Command cni-client drives a CNI network config list through libcni, the reference Go
// library container runtimes use, so that sdn-node-cni is tested against the real client
// rather than against our reading of the spec. Built and run by cni/tests/libcni.rs.
//
// Usage:
//
//	cni-client -conflist F -bin DIR -cache DIR [-containerid ID] [-netns NS] [-ifname IF]
//	           [-args 'K=V;K=V'] add|check|del|version|validate
//
// It prints one JSON object on stdout and exits with:
//
//	0  success: {"ok":true, ...} ("result" and "result100" for add, "versions" for version)
//	2  the plugin returned a CNI error: {"ok":false,"code":N,"msg":..,"details":..}
//	3  any other failure (libcni, exec, decoding): {"ok":false,"error":".."}
//	64 bad usage
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
)

func emit(code int, v map[string]interface{}) {
	out, err := json.Marshal(v)
	if err != nil {
		fmt.Printf("{\"ok\":false,\"error\":%q}\n", err.Error())
		os.Exit(3)
	}
	fmt.Println(string(out))
	os.Exit(code)
}

func fail(err error) {
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		emit(2, map[string]interface{}{
			"ok": false, "code": cniErr.Code, "msg": cniErr.Msg, "details": cniErr.Details,
			"error": err.Error(),
		})
	}
	emit(3, map[string]interface{}{"ok": false, "error": err.Error()})
}

func main() {
	conflist := flag.String("conflist", "", "network config list file")
	binDir := flag.String("bin", "", "CNI plugin directory")
	cacheDir := flag.String("cache", "", "libcni result cache directory")
	containerID := flag.String("containerid", "c0ffee", "CNI_CONTAINERID")
	netns := flag.String("netns", "/var/run/netns/test", "CNI_NETNS")
	ifName := flag.String("ifname", "eth0", "CNI_IFNAME")
	args := flag.String("args", "", "CNI_ARGS as K=V;K=V")
	timeout := flag.Duration("timeout", 60*time.Second, "overall deadline")
	flag.Parse()
	if flag.NArg() != 1 || *conflist == "" || *binDir == "" || *cacheDir == "" {
		fmt.Fprintln(os.Stderr, "usage: cni-client -conflist F -bin DIR -cache DIR [flags] add|check|del|version|validate")
		os.Exit(64)
	}

	list, err := libcni.ConfListFromFile(*conflist)
	if err != nil {
		fail(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{*binDir}, *cacheDir, nil)
	rt := &libcni.RuntimeConf{ContainerID: *containerID, NetNS: *netns, IfName: *ifName, CacheDir: *cacheDir}
	if *args != "" {
		for _, pair := range strings.Split(*args, ";") {
			kv := strings.SplitN(pair, "=", 2)
			if len(kv) != 2 {
				fmt.Fprintf(os.Stderr, "bad -args pair %q\n", pair)
				os.Exit(64)
			}
			rt.Args = append(rt.Args, [2]string{kv[0], kv[1]})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	switch flag.Arg(0) {
	case "add":
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail(err)
		}
		// The result as libcni decoded it in the config's version, and converted to 1.0.0:
		// a field of the wrong shape would be lost or fail the conversion.
		conv, err := types100.NewResultFromResult(res)
		if err != nil {
			fail(err)
		}
		emit(0, map[string]interface{}{"ok": true, "version": res.Version(), "result": res, "result100": conv})
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
		emit(0, map[string]interface{}{"ok": true})
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
		emit(0, map[string]interface{}{"ok": true})
	case "version":
		info, err := cni.GetVersionInfo(ctx, list.Plugins[0].Network.Type)
		if err != nil {
			fail(err)
		}
		emit(0, map[string]interface{}{"ok": true, "versions": info.SupportedVersions()})
	case "validate":
		caps, err := cni.ValidateNetworkList(ctx, list)
		if err != nil {
			fail(err)
		}
		emit(0, map[string]interface{}{"ok": true, "capabilities": caps})
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n", flag.Arg(0))
		os.Exit(64)
	}
}
