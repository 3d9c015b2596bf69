"""agentloop.sandboxes"""
