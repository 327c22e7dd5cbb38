/* Shared by refract's tc programs: the flow key and the header walk to it. */
#ifndef REFRACT_COMMON_H
#define REFRACT_COMMON_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* One direction of a TCP flow as it arrives: client -> VIP. All fields in network order.
 * Must match `FlowKey` in src/steering.rs byte for byte. */
struct flow_key {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
};

/* Finds the Ethernet, IPv4 and TCP headers; 0 when the packet is anything else (it passes). */
static __always_inline int parse_tcp4(struct __sk_buff *skb, struct ethhdr **eth,
				      struct iphdr **ip, struct tcphdr **th)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;

	*eth = data;
	if ((void *)(*eth + 1) > end || (*eth)->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	*ip = (void *)(*eth + 1);
	if ((void *)(*ip + 1) > end || (*ip)->protocol != IPPROTO_TCP || (*ip)->ihl < 5)
		return 0;
	*th = (void *)*ip + (*ip)->ihl * 4;  /* IP options do not hide a flow from the map */
	if ((void *)(*th + 1) > end)
		return 0;
	return 1;
}

static __always_inline void bump(void *counters, __u32 i)
{
	__u64 *c = bpf_map_lookup_elem(counters, &i);

	if (c)
		__sync_fetch_and_add(c, 1);
}

#endif
