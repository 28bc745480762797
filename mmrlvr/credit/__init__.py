"""mmrlvr.credit"""
