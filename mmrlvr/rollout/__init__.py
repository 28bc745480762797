"""mmrlvr.rollout"""
